//! The page-size switches change how the weights are mapped, never what is computed: greedy
//! ids from the committed demo model are the same with the default (2 MiB pages asked for),
//! `--no-huge-pages` and `--reread-huge-pages` (the file dropped from the page cache first).

use std::path::Path;
use std::process::Command;

fn greedy_ids(extra: &[&str]) -> String {
    let model = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../models/demo/tiny-qwen35-q4_k_m.gguf");
    let out = Command::new(env!("CARGO_BIN_EXE_xwen"))
        .args(["run", "-q", "--temp", "0", "--print-ids", "-t", "2", "-n", "12", "--ids", "1,2,3,4,5", "-m"])
        .arg(&model)
        .args(extra)
        .output()
        .unwrap();
    assert!(out.status.success(), "{extra:?}: {}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8(out.stdout).unwrap()
}

#[test]
fn page_switches_leave_the_output_unchanged() {
    let base = greedy_ids(&[]);
    assert_eq!(base.split_whitespace().count(), 12, "{base}");
    assert_eq!(greedy_ids(&["--no-huge-pages"]), base);
    assert_eq!(greedy_ids(&["--reread-huge-pages"]), base);
}
