//! docs/cli.md, generated from the clap definitions: each command's `--help`, so the reference
//! cannot drift from the binary. A unit test compares the file with what this renders;
//! `XWEN_UPDATE_DOCS=1 cargo test -p xwen-cli --release cli_doc` rewrites it.

/// The whole reference page.
pub fn markdown(mut cmd: clap::Command) -> String {
    cmd.build();
    let mut out = String::from(
        "# xwen command-line reference\n\n\
         Generated from the clap definitions (`crates/xwen-cli/src/cli.rs`, `opts.rs`) by\n\
         `XWEN_UPDATE_DOCS=1 cargo test -p xwen-cli --release cli_doc`; a test fails when this\n\
         file and `xwen <command> --help` disagree.\n\n\
         llama.cpp's multi-letter short flags are accepted as they are spelled there: `-np`\n\
         (`--parallel`), `-npl` (`bench --parallel`), `-ngl` (`--n-gpu-layers`), `-ub`\n\
         (`--ubatch-size`), `-npp` (`--n-prompt`), `-ntg` (`--n-gen`), `-sys` (`--system-prompt`),\n\
         `-ctk` / `-ctv` (`--cache-type-k` / `-v`), `-fa` (`--flash-attn`).\n\
         Any flag also reads as `--flag=value`; a repeated flag keeps its last value.\n\n",
    );
    out += &section("xwen", cmd.render_long_help().to_string());
    for sub in cmd.get_subcommands_mut().filter(|s| s.get_name() != "help") {
        let name = format!("xwen {}", sub.get_name());
        out += &section(&name, sub.render_long_help().to_string());
    }
    out
}

fn section(title: &str, help: String) -> String {
    let body: Vec<&str> = help.lines().map(str::trim_end).collect();
    format!("## `{title}`\n\n```text\n{}\n```\n\n", body.join("\n").trim_end())
}

#[cfg(test)]
mod tests {
    #[test]
    fn docs_cli_md_is_current() {
        let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../../docs/cli.md");
        let want = super::markdown(crate::command());
        if std::env::var_os("XWEN_UPDATE_DOCS").is_some() {
            std::fs::write(path, &want).unwrap();
        }
        let have = std::fs::read_to_string(path).unwrap_or_default();
        assert!(have == want, "docs/cli.md is stale: XWEN_UPDATE_DOCS=1 cargo test -p xwen-cli --release cli_doc");
    }
}
