//! Marks the tests whose data a fresh clone lacks (see ../prereqs.rs).

include!("../prereqs.rs");

fn main() {
    println!("cargo::rerun-if-changed=build.rs");
    check_prereqs(&[NVRTC]);
}
