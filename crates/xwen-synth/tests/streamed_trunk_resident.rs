//! Under a RAM budget the mapped trunk keeps no more of the file resident than the plan counts
//! for it. The mapping asks for 2 MiB pages (`MapPages::Huge`), and a 2 MiB page that a trunk
//! tensor shares with a routed expert's stack maps the expert's bytes too — on a 6.18 kernel a
//! fault maps the whole 2 MiB folio even with 4 KiB entries. Counting only the trunk tensors'
//! own bytes left the synthetic 35B-A3B 240 MiB over its budget (peak RSS 8.19 GiB at 8 GiB);
//! the plan now counts the 2 MiB pages (`plan::resident_trunk_bytes`).

use xwen_engine::{EngineConfig, LogitsMode, Model};
use xwen_synth::{write_synthetic, Preset};

/// Resident bytes of every mapping of `path` in this process (/proc/self/smaps `Rss:`), or None
/// where the system does not say.
fn mapped_resident(path: &std::path::Path) -> Option<u64> {
    let smaps = std::fs::read_to_string("/proc/self/smaps").ok()?;
    let want = path.to_str()?;
    let (mut ours, mut total) = (false, 0u64);
    for line in smaps.lines() {
        let mut f = line.split_whitespace();
        let head = f.next().unwrap_or("");
        if head.contains('-') && head.split('-').all(|h| u64::from_str_radix(h, 16).is_ok()) {
            // a mapping's range line: its pathname is the sixth field
            ours = line.split_whitespace().nth(5) == Some(want);
        } else if ours && head == "Rss:" {
            total += f.next()?.parse::<u64>().ok()? * 1024;
        }
    }
    Some(total)
}

#[test]
fn the_mapped_trunk_stays_inside_what_the_plan_counts() {
    let dir = std::env::temp_dir().join(format!("xwen-trunk-resident-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("moe-small.gguf");
    write_synthetic(Preset::Qwen35MoeSmall, &path, None, 7).unwrap();
    let cfg = EngineConfig { threads: 2, max_ctx: 256, ram_budget: Some(200 << 20), ..Default::default() };
    let model = Model::load(&path, &cfg).unwrap();
    assert!(model.streams_experts());
    model.prefault(&mut |_, _| {});
    let mut state = model.new_state();
    let prompt: Vec<u32> = (1..40).collect();
    model.forward(&mut state, &prompt, LogitsMode::Last).unwrap();
    for t in 0..8u32 {
        model.forward(&mut state, &[100 + t], LogitsMode::Last).unwrap();
    }
    let plan = model.memory_plan().unwrap();
    let file = model.gguf();
    let own_bytes: u64 = file.tensors().iter().filter(|t| !t.name.ends_with("_exps.weight")).map(|t| t.n_bytes).sum();
    match mapped_resident(&path) {
        Some(resident) => {
            eprintln!(
                "mapping resident {:.1} MiB; plan's trunk {:.1} MiB; trunk tensors {:.1} MiB; file {:.1} MiB",
                resident as f64 / 1048576.0,
                plan.trunk_bytes as f64 / 1048576.0,
                own_bytes as f64 / 1048576.0,
                file.file_len() as f64 / 1048576.0
            );
            assert!(resident <= plan.trunk_bytes, "the mapping keeps {resident} B resident, the plan counts {} B", plan.trunk_bytes);
            // the trunk was paged in: the check above is about something
            assert!(resident >= own_bytes / 2, "{resident} B resident of {own_bytes} B of trunk tensors");
        }
        None => eprintln!("SKIP: /proc/self/smaps is not available here"),
    }
    assert!(plan.trunk_bytes >= own_bytes + file.data_offset() && plan.trunk_bytes <= file.file_len());
    drop(model);
    std::fs::remove_dir_all(&dir).unwrap();
}
