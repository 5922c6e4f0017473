//! `--ram-budget`: a MoE model larger than the budget runs with its experts streamed from disk,
//! gives the greedy ids of the fully mapped run, and the process's peak RSS stays under the
//! budget; a budget under the floor and a malformed size are refused with a clear message.

use std::path::PathBuf;
use std::process::{Command, Output};

fn xwen(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_xwen")).args(args).output().unwrap()
}

fn synth_small() -> PathBuf {
    let p = std::env::temp_dir().join(format!("xwen-ram-budget-{}.gguf", std::process::id()));
    let out = xwen(&["synth", "--preset", "qwen35moe-small", "--out", p.to_str().unwrap()]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    p
}

fn greedy(model: &str, extra: &[&str]) -> (String, String, Option<u64>) {
    let mut args = vec!["run", "--temp", "0", "--print-ids", "-t", "2", "-c", "256", "-n", "16", "--ids", "1,2,3,4,5,6,7,8", "-m", model];
    args.extend_from_slice(extra);
    let (ok, stdout, stderr, peak) = run_measured(&args);
    assert!(ok, "{extra:?}: {stderr}");
    (stdout, stderr, peak)
}

/// Runs xwen; returns (success, stdout, stderr, the child's own peak RSS in bytes where the
/// system reports it: wait4's rusage, which counts this child alone).
#[allow(clippy::zombie_processes)] // reaped by wait4 (Linux) or wait below
fn run_measured(args: &[&str]) -> (bool, String, String, Option<u64>) {
    use std::io::Read;
    use std::process::Stdio;
    let mut child = Command::new(env!("CARGO_BIN_EXE_xwen"))
        .args(args)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut err_pipe = child.stderr.take().unwrap();
    let err_thread = std::thread::spawn(move || {
        let mut s = String::new();
        err_pipe.read_to_string(&mut s).unwrap();
        s
    });
    let mut stdout = String::new();
    child.stdout.take().unwrap().read_to_string(&mut stdout).unwrap();
    let stderr = err_thread.join().unwrap();
    #[cfg(target_os = "linux")]
    {
        let mut status = 0;
        // SAFETY: reaps our own child (std's Child is not waited on afterwards); fills `ru`.
        let mut ru: libc::rusage = unsafe { std::mem::zeroed() };
        let pid = unsafe { libc::wait4(child.id() as libc::pid_t, &mut status, 0, &mut ru) };
        assert_eq!(pid, child.id() as libc::pid_t);
        let ok = libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 0;
        (ok, stdout, stderr, Some(ru.ru_maxrss as u64 * 1024))
    }
    #[cfg(not(target_os = "linux"))]
    {
        let ok = child.wait().unwrap().success();
        (ok, stdout, stderr, None)
    }
}

#[test]
fn a_moe_model_larger_than_the_budget_runs_within_it() {
    let model = synth_small();
    let m = model.to_str().unwrap();
    let size = std::fs::metadata(&model).unwrap().len();
    let budget: u64 = 176 << 20;
    assert!(size > budget + (48 << 20), "the model ({size} B) must outgrow the budget");

    let (streamed, log, peak) = greedy(m, &["--ram-budget", "176M"]);
    assert!(log.contains("routed experts stream from disk"), "{log}");
    assert!(log.contains("expert cache:") && log.contains("evictions"), "{log}");
    if let Some(peak) = peak {
        assert!(peak <= budget, "peak RSS {peak} B over the {budget} B budget\n{log}");
        eprintln!("peak RSS {:.1} MiB under a {} MiB budget, model {:.1} MiB", peak as f64 / 1048576.0, budget >> 20, size as f64 / 1048576.0);
    }

    let (resident, _, _) = greedy(m, &[]);
    assert_eq!(streamed, resident, "greedy ids differ between streamed and mapped experts");
    assert_eq!(resident.split_whitespace().count(), 16, "{resident}");

    let out = xwen(&["run", "-c", "256", "--ids", "1,2", "-n", "1", "--ram-budget", "20M", "-m", m]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success() && err.contains("under this model's floor"), "{err}");
    // bench --json reports the cache over each test's timed repetitions (null when mapped)
    let cache_of = |extra: &[&str]| {
        let mut args = vec!["bench", "-m", m, "-c", "256", "-p", "8", "-n", "4", "-r", "1", "-t", "2", "--json"];
        args.extend_from_slice(extra);
        let out = xwen(&args);
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
        let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
        v.as_array().unwrap().iter().map(|t| t["expert_cache"].clone()).collect::<Vec<_>>()
    };
    for c in cache_of(&["--ram-budget", "176M"]) {
        assert!(c["misses"].as_u64().is_some_and(|m| m > 0) && c["bytes_read_per_token"].as_u64().is_some_and(|b| b > 0), "{c}");
        assert!(c["hit_rate"].as_f64().is_some_and(|h| (0.0..=1.0).contains(&h)), "{c}");
        // one read per expert record, each no more than its bytes widened to whole 4 KiB
        // blocks (three ranges from the GGUF: at most 4 blocks over the expert's bytes)
        let (reads, eb, read) = (c["reads"].as_u64().unwrap(), c["expert_bytes"].as_u64().unwrap(), c["bytes_read"].as_u64().unwrap());
        assert!(reads > 0 && eb > 0, "{c}");
        assert!(read <= reads * (eb + 4 * 4096) && read >= reads * (eb / 2), "{read} bytes in {reads} reads of {eb}-byte experts: {c}");
    }
    assert!(cache_of(&[]).iter().all(|c| c.is_null()));
    std::fs::remove_file(&model).unwrap();
}

#[test]
fn a_malformed_budget_is_refused() {
    for bad in ["12Q", "lots", "-3G"] {
        let out = xwen(&["run", "--ids", "1", "-n", "1", "--ram-budget", bad]);
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success() && err.contains("--ram-budget"), "{bad}: {err}");
    }
}
