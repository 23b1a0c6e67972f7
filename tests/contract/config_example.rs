//! deploy/config.example.toml documents the configuration truthfully: it is assembled from
//! deploy/config.d/, every key in it is a key of `Config` with its one-line comment, and the values it
//! shows are the defaults the code uses.

use crate::support;

use std::process::Command;

use volcano_runner::config::Config;

use support::root;

fn example_path() -> std::path::PathBuf {
    root().join("deploy/config.example.toml")
}

/// The file is what scripts/assemble-config makes from deploy/config.d/*.toml.
#[test]
fn example_is_assembled_from_config_d() {
    let out = Command::new(root().join("scripts/assemble-config"))
        .arg("--check")
        .output()
        .expect("scripts/assemble-config runs");
    assert!(
        out.status.success(),
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

/// Every key parses into `Config` (unknown keys are errors), and the values shown are exactly
/// `Config::default()`. Sections are compared through `Debug`, because the section types belong to
/// other modules; configuration maps must therefore be ordered (BTreeMap), never HashMap.
#[test]
fn example_parses_to_the_defaults() {
    let text = std::fs::read_to_string(example_path()).unwrap();
    let parsed = Config::from_toml(&example_path(), &text)
        .unwrap_or_else(|e| panic!("deploy/config.example.toml: {e}"));
    assert_eq!(format!("{parsed:#?}"), format!("{:#?}", Config::default()));
}

/// Every key is documented: it has a comment line right above it, or it belongs to a block of key lines
/// (no blank line between them) whose first line, or table header, has one, as grouped keys such as
/// routing keys do.
#[test]
fn every_key_is_documented() {
    let text = std::fs::read_to_string(example_path()).unwrap();
    let mut previous_documented = false;
    for (n, line) in text.lines().enumerate() {
        let trimmed = line.trim();
        if trimmed.is_empty() {
            previous_documented = false;
        } else if trimmed.starts_with('[') {
            // A table header keeps the comment above it for its keys.
        } else if trimmed.starts_with('#') {
            previous_documented = true;
        } else {
            assert!(
                previous_documented,
                "deploy/config.example.toml line {}: `{trimmed}` has no comment above it or above its block",
                n + 1
            );
        }
    }
}

/// The commented license server example in deploy/config.d/licenses.toml is a working configuration.
#[test]
fn license_example_works_when_uncommented() {
    let text = std::fs::read_to_string(root().join("deploy/config.d/licenses.toml")).unwrap();
    let start = text.find("# [licenses.").expect("an example table");
    let uncommented: String = text[start..]
        .lines()
        .map(|l| l.trim_start_matches('#').trim_start())
        .collect::<Vec<_>>()
        .join("\n");
    let config = Config::from_toml(std::path::Path::new("licenses.toml"), &uncommented)
        .unwrap_or_else(|e| panic!("{e}\n{uncommented}"));
    let server = &config.licenses["matlab-campus"];
    assert_eq!(server.port, 27000);
    assert!(server.license.is_some());
}

/// The commented whole-node example in deploy/config.d/pipeline.toml is a working configuration: a
/// whole-node charge by category and the two limits.
#[test]
fn whole_node_example_works_when_uncommented() {
    let text = std::fs::read_to_string(root().join("deploy/config.d/pipeline.toml")).unwrap();
    let start = text.find("[pipeline.whole_nodes]").expect("the section");
    // The commented keys and tables, without the prose and without the empty default map they replace.
    let uncommented: String = text[start..]
        .lines()
        .map(|l| l.trim_start_matches('#').trim_start())
        .filter(|l| {
            l.starts_with('[')
                || l.split_once(" = ")
                    .is_some_and(|(k, _)| k.chars().all(|c| c.is_ascii_lowercase() || c == '_'))
        })
        .filter(|l| !l.starts_with("products = "))
        .collect::<Vec<_>>()
        .join("\n");
    let config = Config::from_toml(std::path::Path::new("pipeline.toml"), &uncommented)
        .unwrap_or_else(|e| panic!("{e}\n{uncommented}"));
    let whole = &config.pipeline.whole_nodes;
    assert_eq!(whole.max_per_owner, Some(8), "{uncommented}");
    let entry = whole
        .entry("u1-gpu-4", "u1-gpu")
        .expect("an entry by category");
    assert_eq!(
        (
            entry.product.as_str(),
            entry.cpu,
            entry.memory_gib,
            entry.gpu
        ),
        ("u1-gpu-node", 64, 512, 4)
    );
    assert_eq!(entry.max_per_owner, Some(2));
    assert!(whole.entry("u1-standard-1", "u1-standard").is_none());
}
