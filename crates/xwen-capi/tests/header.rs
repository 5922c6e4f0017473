//! include/xwen.h is what cbindgen makes of this crate: regenerated here, a difference fails
//! (XWEN_BLESS=1 writes it instead).

use std::path::Path;

#[test]
fn header_is_current() {
    let krate = Path::new(env!("CARGO_MANIFEST_DIR"));
    let config = cbindgen::Config::from_file(krate.join("cbindgen.toml")).unwrap();
    let mut made = Vec::new();
    cbindgen::Builder::new().with_crate(krate).with_config(config).generate().expect("cbindgen").write(&mut made);
    let made = String::from_utf8(made).unwrap();
    let path = krate.join("../../include/xwen.h");
    if std::env::var_os("XWEN_BLESS").is_some() {
        std::fs::write(&path, &made).unwrap();
        return;
    }
    let checked_in = std::fs::read_to_string(&path).unwrap_or_default();
    assert!(checked_in == made, "include/xwen.h is not what cbindgen makes of crates/xwen-capi: XWEN_BLESS=1 cargo test --release -p xwen-capi --test header");
}
