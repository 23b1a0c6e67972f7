//! Helpers shared by the contract tests: paths, the test configuration, schemas and examples.
#![allow(dead_code)]

use std::path::{Path, PathBuf};

use volcano_runner::config::Config;
use volcano_runner::messages::MessageType;

/// The repository root.
pub fn root() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

/// The configuration messages are validated with: defaults plus the examples' license server.
pub fn test_config() -> Config {
    let path = root().join("tests/fixtures/config.toml");
    let text = std::fs::read_to_string(&path).expect("tests/fixtures/config.toml");
    Config::from_toml(&path, &text).expect("the test configuration loads")
}

/// The path of a message's JSON Schema.
pub fn schema_path(message_type: MessageType) -> PathBuf {
    root()
        .join("schemas")
        .join(format!("{}.schema.json", message_type.file_stem()))
}

/// A message's JSON Schema.
pub fn schema(message_type: MessageType) -> serde_json::Value {
    read_json(&schema_path(message_type))
}

/// A draft 2020-12 validator for a schema, with `format` (date-time, ipv4, ipv6) checked.
pub fn validator_for(schema: &serde_json::Value) -> jsonschema::Validator {
    jsonschema::draft202012::options()
        .should_validate_formats(true)
        .build(schema)
        .unwrap_or_else(|e| panic!("the schema does not compile: {e}"))
}

/// A message's schema validator.
pub fn validator(message_type: MessageType) -> jsonschema::Validator {
    validator_for(&schema(message_type))
}

/// Every schema violation of `instance`, one line each (empty when valid).
pub fn schema_errors(
    validator: &jsonschema::Validator,
    instance: &serde_json::Value,
) -> Vec<String> {
    validator
        .iter_errors(instance)
        .map(|e| format!("{}: {e}", e.instance_path()))
        .collect()
}

/// The JSON files of a directory, sorted.
pub fn json_files(dir: &Path) -> Vec<PathBuf> {
    let mut files: Vec<PathBuf> = std::fs::read_dir(dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .map(|entry| entry.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "json"))
        .collect();
    files.sort();
    files
}

/// The examples in schemas/examples, with the message type their names declare.
pub fn examples() -> Vec<(PathBuf, MessageType)> {
    json_files(&root().join("schemas/examples"))
        .into_iter()
        .map(|path| {
            let t = MessageType::from_file_name(&path)
                .unwrap_or_else(|| panic!("{}: name starts with no message stem", path.display()));
            (path, t)
        })
        .collect()
}

pub fn read_json(path: &Path) -> serde_json::Value {
    let text = std::fs::read(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    serde_json::from_slice(&text).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}
