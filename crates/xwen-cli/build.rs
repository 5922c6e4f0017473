//! Records the git commit the binary is built from, for `xwen --version`. Outside a git
//! checkout (a source tarball) the version says "unknown commit". Also marks the tests whose
//! data a fresh clone lacks (see ../prereqs.rs).

use std::process::Command;

include!("../prereqs.rs");

fn main() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let git = |args: &[&str]| -> Option<String> {
        let out = Command::new("git").arg("-C").arg(&root).args(args).output().ok()?;
        out.status.success().then(|| String::from_utf8_lossy(&out.stdout).trim().to_string())
    };
    let hash = git(&["rev-parse", "--short=10", "HEAD"]).unwrap_or_else(|| "unknown commit".into());
    println!("cargo:rustc-env=XWEN_GIT_HASH={hash}");
    // rebuild when HEAD moves: the HEAD file (branch switches) and the ref it names (commits)
    if let Some(git_dir) = git(&["rev-parse", "--absolute-git-dir"]) {
        let git_dir = Path::new(&git_dir);
        println!("cargo:rerun-if-changed={}", git_dir.join("HEAD").display());
        if let Some(r) = git(&["symbolic-ref", "-q", "HEAD"]) {
            println!("cargo:rerun-if-changed={}", git_dir.join(r).display());
        }
        println!("cargo:rerun-if-changed={}", git_dir.join("packed-refs").display());
    }
    println!("cargo:rerun-if-changed=build.rs");
    check_prereqs(&[SHARED_MODELS, SDK_VENV, CHROMIUM]);
}
