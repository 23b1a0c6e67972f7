//! The one typed configuration of volcano-runner.
//!
//! The library sections are owned by the modules that read them (`[broker]`, `[cluster]`, `[pipeline]`,
//! `[sim]`, `[ops]`), each with its own error type, and none of those modules depends on this one; the
//! sections of the parts that consume the whole configuration (`[runner]`, `[monitor]`, `[proxy_sync]`)
//! are defined here, in [`runner`], [`monitor`] and [`proxy_sync`]. This module composes them and loads
//! the whole from a TOML file with `VOLCANO_RUNNER_*` environment overrides (tests/contract/layout.rs holds the dependency rule). Anything wrong (a syntax error, an unknown
//! key, a value of the wrong type, a value out of range) stops the program at start with the exact key,
//! the reason, and where the value came from.
//!
//! # Environment overrides
//! Every key can be set as `VOLCANO_RUNNER_<SECTION>__<KEY>`: upper case, with a double underscore
//! between levels, e.g. `VOLCANO_RUNNER_LIMITS__MAX_REPLICAS=128` for `[limits] max_replicas` or
//! `VOLCANO_RUNNER_LICENSES__MATLAB__PORT=27001` for `[licenses.matlab] port`. Names are lower-cased to
//! find the key, so keys that need upper case or `-` (some license ids) can only be set in the file.
//!
//! The value is read as a TOML value when it is one (`128`, `true`, `["a", "b"]`, `{ address = "x",
//! port = 1 }`) and as a string otherwise; a value that parses as a number or boolean but belongs to a
//! string key is taken as the string it was written as. A whole section can be given as an inline table,
//! `VOLCANO_RUNNER_LIMITS='{ max_replicas = 8 }'`.
//!
//! Variables without `__` that do not name a section (`VOLCANO_RUNNER_CONFIG`, the file to load) belong
//! to command-line options and are left alone, except that `VOLCANO_RUNNER_LIMITS_MAX_REPLICAS` and the
//! like (a section name, then a single `_`) are rejected as a misspelt override.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use serde::Deserialize;

pub mod monitor;
pub mod proxy_sync;
pub mod runner;
pub mod sessions;

pub use monitor::MonitorConfig;
pub use proxy_sync::ProxySyncConfig;
pub use runner::RunnerConfig;
pub use sessions::SessionsConfig;

use crate::pipeline::{PipelineConfig, Settings};

/// The prefix of every environment variable the configuration reads.
pub const ENV_PREFIX: &str = "VOLCANO_RUNNER_";

/// Everything a runner can be configured with. Every section has documented defaults in
/// `deploy/config.example.toml`; an unknown key is an error at start.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Config {
    /// Bounds on what a submission may ask for.
    pub limits: LimitsConfig,
    /// License servers by the id that `license_server` parameter values name. The orchestrator only knows
    /// the id; the address and key are the provider's business.
    pub licenses: BTreeMap<String, LicenseServer>,
    pub broker: crate::broker::BrokerConfig,
    pub cluster: crate::cluster::ClusterConfig,
    pub pipeline: crate::pipeline::PipelineConfig,
    pub runner: RunnerConfig,
    pub monitor: MonitorConfig,
    pub sim: crate::sim::SimConfig,
    pub ops: crate::ops::OpsConfig,
    pub proxy_sync: ProxySyncConfig,
    /// `[sessions]`: interactive sessions (their lifetime, URLs and sweep).
    pub sessions: SessionsConfig,
    /// `[bookings]`: booked starts (how far ahead, how much of the cluster).
    pub bookings: crate::cluster::BookingsConfig,
}

/// Bounds on submissions, checked by validation before anything reaches the cluster.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct LimitsConfig {
    /// The largest gang a single job may ask for. A typo of 1000 replicas should be rejected with a clear
    /// message, not sit in the queue forever.
    pub max_replicas: u32,
}

impl Default for LimitsConfig {
    fn default() -> Self {
        Self { max_replicas: 64 }
    }
}

pub use crate::pipeline::LicenseServer;
pub use crate::secret::Secret;

/// Why the configuration could not be loaded: names the key (or file) and the reason.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("configuration {key}: {reason}")]
    Invalid { key: String, reason: String },
    /// The reason is part of the message (not a `source`), so that it is printed exactly once.
    #[error("cannot read configuration file {}: {error}", path.display())]
    Read {
        path: PathBuf,
        error: std::io::Error,
    },
    #[error("configuration file {} is not valid TOML: {message}", path.display())]
    Syntax { path: PathBuf, message: String },
}

/// The `[pipeline]` section, for the pipeline's hooks (which need nothing else).
impl AsRef<PipelineConfig> for Config {
    fn as_ref(&self) -> &PipelineConfig {
        &self.pipeline
    }
}

/// What rendering a job reads: `[pipeline]` and the license servers.
impl<'a> From<&'a Config> for Settings<'a> {
    fn from(config: &'a Config) -> Self {
        Settings {
            pipeline: &config.pipeline,
            licenses: &config.licenses,
        }
    }
}

impl<'a> From<&'a std::sync::Arc<Config>> for Settings<'a> {
    fn from(config: &'a std::sync::Arc<Config>) -> Self {
        Settings::from(&**config)
    }
}

/// What validation reads: the replica limit and the license server ids.
impl<'a> From<&'a Config> for crate::validate::Rules<'a> {
    fn from(config: &'a Config) -> Self {
        crate::validate::Rules {
            max_replicas: config.limits.max_replicas,
            license_ids: config.licenses.keys().map(String::as_str).collect(),
        }
    }
}

impl<'a> From<&'a std::sync::Arc<Config>> for crate::validate::Rules<'a> {
    fn from(config: &'a std::sync::Arc<Config>) -> Self {
        Self::from(&**config)
    }
}

impl Config {
    /// Every secret this configuration holds (the broker URL's password, license keys), for the log
    /// redactor to remove wherever they appear.
    pub fn secrets(&self) -> Vec<&str> {
        let mut secrets = Vec::new();
        if let Some(password) = crate::ops::redact::url_password(self.broker.url.expose()) {
            secrets.push(password);
        }
        for server in self.licenses.values() {
            if let Some(key) = &server.license {
                secrets.push(key.expose());
            }
        }
        secrets
    }

    /// Loads the configuration the way the program does: the TOML file, when one is given, then the
    /// `VOLCANO_RUNNER_*` variables of the process environment on top.
    pub fn load(file: Option<&Path>) -> Result<Config, ConfigError> {
        let mut env = Vec::new();
        for (name, value) in std::env::vars_os() {
            let Some(name) = name.to_str().filter(|n| n.starts_with(ENV_PREFIX)) else {
                continue;
            };
            let value = value.into_string().map_err(|_| ConfigError::Invalid {
                key: name.to_owned(),
                reason: "the value is not valid UTF-8".into(),
            })?;
            env.push((name.to_owned(), value));
        }
        let text = match file {
            Some(path) => {
                Some(
                    std::fs::read_to_string(path).map_err(|error| ConfigError::Read {
                        path: path.to_owned(),
                        error,
                    })?,
                )
            }
            None => None,
        };
        Config::from_sources(file.zip(text.as_deref()), env)
    }

    /// Parses a configuration file's text, without environment overrides.
    pub fn from_toml(path: &Path, text: &str) -> Result<Config, ConfigError> {
        Config::from_sources(Some((path, text)), std::iter::empty())
    }

    /// The loader itself, pure: `file` is the file's path (for messages) and text; `env` the
    /// environment variables (those without the `VOLCANO_RUNNER_` prefix are ignored).
    pub fn from_sources(
        file: Option<(&Path, &str)>,
        env: impl IntoIterator<Item = (String, String)>,
    ) -> Result<Config, ConfigError> {
        let mut table = match file {
            Some((path, text)) => text
                .parse::<toml::Table>()
                .map_err(|e| ConfigError::Syntax {
                    path: path.to_owned(),
                    message: e.to_string().trim_end().to_owned(),
                })?,
            None => toml::Table::new(),
        };
        let mut overrides = Vec::new();
        let mut env: Vec<(String, String)> = env.into_iter().collect();
        env.sort();
        for (name, raw) in env {
            if let Some(key) = env_key(&name)? {
                set(&mut table, &key, parse_env_value(&raw)).map_err(|reason| {
                    ConfigError::Invalid {
                        key: key.join("."),
                        reason: format!("{reason} (set by {name})"),
                    }
                })?;
                overrides.push(Override { name, key, raw });
            }
        }
        let config = deserialize(table, &overrides, file.map(|(p, _)| p))?;
        config.check()?;
        Ok(config)
    }

    /// Rules that types alone cannot express, for every section; [`Config::load`] runs it, and so does
    /// anything that changes a loaded configuration.
    pub fn check(&self) -> Result<(), ConfigError> {
        let invalid = |key: String, reason: &str| ConfigError::Invalid {
            key,
            reason: reason.to_owned(),
        };
        if self.limits.max_replicas == 0 {
            return Err(invalid("limits.max_replicas".into(), "must be at least 1"));
        }
        for (id, server) in &self.licenses {
            if server.address.trim().is_empty() {
                return Err(invalid(
                    format!("licenses.{id}.address"),
                    "must not be empty",
                ));
            }
            if server.port == 0 {
                return Err(invalid(format!("licenses.{id}.port"), "must be 1 to 65535"));
            }
        }
        // Every section, for every command: a value `run` would refuse is refused by `render`, `sim` and
        // the rest alike, at load, naming the key.
        // Each section owns its error (key and reason); here they become one.
        let invalid = |key: String, reason: String| ConfigError::Invalid { key, reason };
        self.broker.check().map_err(|e| invalid(e.key, e.reason))?;
        self.cluster
            .validate()
            .map_err(|e| invalid(e.key, e.reason))?;
        self.pipeline
            .validate()
            .map_err(|e| invalid(e.key, e.reason))?;
        self.runner.check().map_err(|e| invalid(e.key, e.reason))?;
        self.monitor
            .validate()
            .map_err(|e| invalid(e.key, e.reason))?;
        self.ops.check().map_err(|e| invalid(e.key, e.reason))?;
        self.proxy_sync
            .check()
            .map_err(|e| invalid(e.key, e.reason))?;
        self.sessions
            .check()
            .map_err(|e| invalid(e.key, e.reason))?;
        self.bookings
            .validate()
            .map_err(|e| invalid(e.key, e.reason))?;
        self.sim.validate().map_err(|e| match e {
            crate::sim::SimError::Config { key, reason } => ConfigError::Invalid { key, reason },
            other => ConfigError::Invalid {
                key: "sim".into(),
                reason: other.to_string(),
            },
        })?;
        Ok(())
    }
}

/// One environment variable that set a key.
struct Override {
    name: String,
    key: Vec<String>,
    raw: String,
}

/// The key an environment variable sets, `None` when the variable is not a configuration key.
fn env_key(name: &str) -> Result<Option<Vec<String>>, ConfigError> {
    let Some(rest) = name.strip_prefix(ENV_PREFIX) else {
        return Ok(None);
    };
    let lower = rest.to_ascii_lowercase();
    let sections = section_names();
    if rest.contains("__") {
        let key: Vec<String> = lower.split("__").map(str::to_owned).collect();
        if key.iter().any(String::is_empty) {
            return Err(ConfigError::Invalid {
                key: name.to_owned(),
                reason: "empty key segment: separate levels with exactly two underscores".into(),
            });
        }
        return Ok(Some(key));
    }
    if sections.contains(&lower.as_str()) {
        return Ok(Some(vec![lower]));
    }
    if let Some(section) = sections
        .iter()
        .find(|s| lower.strip_prefix(**s).is_some_and(|r| r.starts_with('_')))
    {
        let suggestion = format!(
            "{ENV_PREFIX}{}__{}",
            section.to_ascii_uppercase(),
            &rest[section.len() + 1..]
        );
        return Err(ConfigError::Invalid {
            key: name.to_owned(),
            reason: format!(
                "looks like a setting in [{section}], but levels are separated by a double \
                 underscore: {suggestion}"
            ),
        });
    }
    Ok(None)
}

/// The top-level keys of [`Config`], read from its `Deserialize` implementation so the list cannot go
/// stale when a section is added.
fn section_names() -> &'static [&'static str] {
    use serde::de::{self, Visitor};

    struct Capture(&'static [&'static str]);

    impl<'de> de::Deserializer<'de> for &mut Capture {
        type Error = de::value::Error;

        fn deserialize_any<V: Visitor<'de>>(self, _: V) -> Result<V::Value, Self::Error> {
            Err(de::Error::custom("only structs are captured"))
        }

        fn deserialize_struct<V: Visitor<'de>>(
            self,
            _name: &'static str,
            fields: &'static [&'static str],
            _visitor: V,
        ) -> Result<V::Value, Self::Error> {
            self.0 = fields;
            Err(de::Error::custom("captured"))
        }

        serde::forward_to_deserialize_any! {
            bool i8 i16 i32 i64 i128 u8 u16 u32 u64 u128 f32 f64 char str string bytes byte_buf
            option unit unit_struct newtype_struct seq tuple tuple_struct map enum identifier
            ignored_any
        }
    }

    static NAMES: std::sync::OnceLock<&'static [&'static str]> = std::sync::OnceLock::new();
    NAMES.get_or_init(|| {
        let mut capture = Capture(&[]);
        // The error is the point: deserialize_struct records the field names and stops.
        let _ = Config::deserialize(&mut capture);
        capture.0
    })
}

/// An environment value as TOML when it is a single TOML value, as a string otherwise.
fn parse_env_value(raw: &str) -> toml::Value {
    format!("value = {raw}")
        .parse::<toml::Table>()
        .ok()
        .filter(|t| t.len() == 1)
        .and_then(|mut t| t.remove("value"))
        .unwrap_or_else(|| toml::Value::String(raw.to_owned()))
}

/// Sets `key` (a path of table keys) in `table`, creating tables on the way.
fn set(table: &mut toml::Table, key: &[String], value: toml::Value) -> Result<(), String> {
    let Some((last, parents)) = key.split_last() else {
        return Err("empty key".into());
    };
    let mut current = table;
    for (depth, part) in parents.iter().enumerate() {
        let entry = current
            .entry(part.clone())
            .or_insert_with(|| toml::Value::Table(toml::Table::new()));
        current = match entry {
            toml::Value::Table(t) => t,
            other => {
                return Err(format!(
                    "{} holds a value of type {}, not a table",
                    key[..=depth].join("."),
                    other.type_str()
                ));
            }
        };
    }
    current.insert(last.clone(), value);
    Ok(())
}

/// Deserializes the merged table. When a value from the environment was read as a number or boolean but
/// the key wants a string, it is retried as the string it was written as.
fn deserialize(
    mut table: toml::Table,
    overrides: &[Override],
    file: Option<&Path>,
) -> Result<Config, ConfigError> {
    let mut retried = vec![false; overrides.len()];
    loop {
        let error = match serde_path_to_error::deserialize::<_, Config>(toml::Value::Table(
            table.clone(),
        )) {
            Ok(config) => return Ok(config),
            Err(error) => error,
        };
        let key = error.path().to_string();
        let mut reason = error.inner().message().trim_end().to_owned();
        let given = lookup(&table, &key).map(|v| match v {
            toml::Value::String(s) => s.clone(),
            other => other.to_string(),
        });
        if let Some(hint) = hint(&reason, given.as_deref()) {
            reason = format!("{reason}; {hint}");
        }
        let source = overrides.iter().enumerate().rev().find(|(_, o)| {
            key == o.key.join(".") || key.starts_with(&format!("{}.", o.key.join(".")))
        });
        if let Some((i, o)) = source {
            if key == o.key.join(".") && !retried[i] && !parse_env_value(&o.raw).is_str() {
                retried[i] = true;
                // Cannot fail: the same key was set before.
                let _ = set(&mut table, &o.key, toml::Value::String(o.raw.clone()));
                continue;
            }
            return Err(ConfigError::Invalid {
                key,
                reason: format!("{reason} (set by {})", o.name),
            });
        }
        let reason = match file {
            Some(path) => format!("{reason} (in {})", path.display()),
            None => reason,
        };
        return Err(ConfigError::Invalid { key, reason });
    }
}

/// The value at a dotted key path in the merged table, when there is one there.
fn lookup<'a>(table: &'a toml::Table, key: &str) -> Option<&'a toml::Value> {
    let mut parts = key.split('.');
    let mut value = table.get(parts.next()?)?;
    for part in parts {
        value = value.as_table()?.get(part)?;
    }
    Some(value)
}

/// What to write instead, when the deserializer's complaint says enough to tell: the nearest known key for
/// a misspelt one, a unit for a duration written as a bare number.
fn hint(reason: &str, given: Option<&str>) -> Option<String> {
    if let Some(rest) = reason.strip_prefix("unknown field `") {
        let (unknown, expected) = rest.split_once('`')?;
        let candidates: Vec<&str> = expected.split('`').skip(1).step_by(2).collect();
        let (best, distance) = candidates
            .iter()
            .map(|c| (*c, edit_distance(unknown, c)))
            .min_by_key(|(_, d)| *d)?;
        let close_enough = distance <= (unknown.chars().count() / 3).max(2);
        return close_enough.then(|| format!("did you mean `{best}`?"));
    }
    let number = given?.trim();
    let bare_number = !number.is_empty() && number.chars().all(|c| c.is_ascii_digit());
    (reason.contains("duration") && bare_number).then(|| {
        format!("a duration needs a unit: write \"{number}s\" (or \"{number}ms\", \"{number}m\")")
    })
}

/// Levenshtein distance: single-character insertions, deletions and substitutions.
fn edit_distance(a: &str, b: &str) -> usize {
    let b: Vec<char> = b.chars().collect();
    let mut previous: Vec<usize> = (0..=b.len()).collect();
    for (i, ca) in a.chars().enumerate() {
        let mut current = vec![i + 1; b.len() + 1];
        for (j, cb) in b.iter().enumerate() {
            let substitute = previous[j] + usize::from(ca != *cb);
            current[j + 1] = substitute.min(previous[j + 1] + 1).min(current[j] + 1);
        }
        previous = current;
    }
    previous[b.len()]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_misspelt_key_and_a_duration_without_unit_get_the_fix() {
        let misspelt = Config::from_sources(file("[runner]\nshutdwn_grace = \"25s\"\n"), env(&[]))
            .unwrap_err()
            .to_string();
        assert!(
            misspelt.contains("did you mean `shutdown_grace`?"),
            "{misspelt}"
        );
        assert!(misspelt.contains("(in runner.toml)"), "{misspelt}");

        let bare = Config::from_sources(file("[runner]\nshutdown_grace = 25\n"), env(&[]))
            .unwrap_err()
            .to_string();
        assert!(bare.contains("write \"25s\""), "{bare}");

        let from_env = Config::from_sources(
            None,
            env(&[("VOLCANO_RUNNER_RUNNER__SHUTDOWN_GRACE", "25")]),
        )
        .unwrap_err()
        .to_string();
        assert!(from_env.contains("write \"25s\""), "{from_env}");
        assert!(
            from_env.contains("set by VOLCANO_RUNNER_RUNNER__SHUTDOWN_GRACE"),
            "{from_env}"
        );

        // Nothing near: no guess.
        let far = Config::from_sources(file("[runner]\ncolour = \"blue\"\n"), env(&[]))
            .unwrap_err()
            .to_string();
        assert!(!far.contains("did you mean"), "{far}");
    }

    #[test]
    fn edit_distances() {
        assert_eq!(edit_distance("shutdwn_grace", "shutdown_grace"), 1);
        assert_eq!(edit_distance("", "abc"), 3);
        assert_eq!(edit_distance("kitten", "sitting"), 3);
    }

    fn env(pairs: &[(&str, &str)]) -> Vec<(String, String)> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    fn file(text: &str) -> Option<(&Path, &str)> {
        Some((Path::new("runner.toml"), text))
    }

    fn invalid(result: Result<Config, ConfigError>) -> (String, String) {
        match result {
            Err(ConfigError::Invalid { key, reason }) => (key, reason),
            other => panic!("expected ConfigError::Invalid, got {other:?}"),
        }
    }

    /// No file and no variables give the defaults.
    #[test]
    fn defaults() {
        let config = Config::from_sources(None, env(&[("PATH", "/bin")])).unwrap();
        assert_eq!(config.limits.max_replicas, 64);
        assert!(config.licenses.is_empty());
    }

    /// A file sets keys, and licenses come with their secret kept out of Debug output.
    #[test]
    fn file_values() {
        let text = r#"
            [limits]
            max_replicas = 8
            [licenses.matlab-campus]
            address = "license.cloud.sdu.dk"
            port = 27000
            license = "K3Y"
        "#;
        let config = Config::from_sources(file(text), env(&[])).unwrap();
        assert_eq!(config.limits.max_replicas, 8);
        let server = &config.licenses["matlab-campus"];
        assert_eq!(
            (server.address.as_str(), server.port),
            ("license.cloud.sdu.dk", 27000)
        );
        assert_eq!(server.license.as_ref().map(Secret::expose), Some("K3Y"));
        assert!(!format!("{config:?}").contains("K3Y"));
    }

    /// An unknown key names the exact key, and where it came from.
    #[test]
    fn unknown_key() {
        let (key, reason) = invalid(Config::from_sources(
            file("[limits]\nmax_replica = 3\n"),
            env(&[]),
        ));
        assert_eq!(key, "limits.max_replica");
        assert!(reason.contains("unknown field `max_replica`"), "{reason}");
        assert!(reason.contains("runner.toml"), "{reason}");
        let (key, _) = invalid(Config::from_sources(file("[limitz]\n"), env(&[])));
        assert_eq!(key, "limitz");
    }

    /// A value of the wrong type names the key and what was expected.
    #[test]
    fn bad_type() {
        let (key, reason) = invalid(Config::from_sources(
            file("[limits]\nmax_replicas = \"many\"\n"),
            env(&[]),
        ));
        assert_eq!(key, "limits.max_replicas");
        assert!(reason.contains("invalid type: string \"many\""), "{reason}");
        let (key, reason) = invalid(Config::from_sources(
            file("[limits]\nmax_replicas = -1\n"),
            env(&[]),
        ));
        assert_eq!(key, "limits.max_replicas");
        assert!(reason.contains("-1"), "{reason}");
    }

    /// Values the types accept but the rules do not.
    #[test]
    fn out_of_range() {
        let (key, reason) = invalid(Config::from_sources(
            file("[limits]\nmax_replicas = 0\n"),
            env(&[]),
        ));
        assert_eq!(
            (key.as_str(), reason.as_str()),
            ("limits.max_replicas", "must be at least 1")
        );
        let text = "[licenses.x]\naddress = \"\"\nport = 1\n";
        let (key, _) = invalid(Config::from_sources(file(text), env(&[])));
        assert_eq!(key, "licenses.x.address");
    }

    /// Whole-node charges and limits that cannot work are refused at load, naming the key.
    #[test]
    fn whole_node_settings_out_of_range() {
        let entry = |extra: &str| {
            format!(
                "[pipeline.whole_nodes.products.u1-gpu]\nproduct = \"u1-gpu-node\"\ncpu = 64\nmemory_gib = 512\n{extra}"
            )
        };
        let ok = Config::from_sources(file(&entry("max_per_owner = 2\n")), env(&[])).unwrap();
        assert_eq!(
            ok.pipeline.whole_nodes.products["u1-gpu"].max_per_owner,
            Some(2)
        );
        let (key, _) = invalid(Config::from_sources(
            file(&entry("max_per_owner = 0\n")),
            env(&[]),
        ));
        assert_eq!(key, "pipeline.whole_nodes.products.u1-gpu.max_per_owner");
        let zero_cpu = entry("").replace("cpu = 64", "cpu = 0");
        let (key, _) = invalid(Config::from_sources(file(&zero_cpu), env(&[])));
        assert_eq!(key, "pipeline.whole_nodes.products.u1-gpu.cpu");
        let no_id = entry("").replace("\"u1-gpu-node\"", "\" \"");
        let (key, _) = invalid(Config::from_sources(file(&no_id), env(&[])));
        assert_eq!(key, "pipeline.whole_nodes.products.u1-gpu.product");
        let (key, _) = invalid(Config::from_sources(
            file("[pipeline.whole_nodes]\nmax_per_owner = 0\n"),
            env(&[]),
        ));
        assert_eq!(key, "pipeline.whole_nodes.max_per_owner");
        let (key, _) = invalid(Config::from_sources(file(&entry("nodes = 3\n")), env(&[])));
        assert_eq!(key, "pipeline.whole_nodes.products.u1-gpu.nodes");
    }

    /// A TOML syntax error says which file and where.
    #[test]
    fn syntax_error() {
        match Config::from_sources(file("[limits\n"), env(&[])) {
            Err(ConfigError::Syntax { path, message }) => {
                assert_eq!(path, Path::new("runner.toml"));
                assert!(message.contains("line 1"), "{message}");
            }
            other => panic!("expected a syntax error, got {other:?}"),
        }
    }

    /// An environment variable overrides the file.
    #[test]
    fn env_override() {
        let config = Config::from_sources(
            file("[limits]\nmax_replicas = 8\n"),
            env(&[("VOLCANO_RUNNER_LIMITS__MAX_REPLICAS", "128")]),
        )
        .unwrap();
        assert_eq!(config.limits.max_replicas, 128);
    }

    /// Nested keys, several levels deep, and a number written for a string key.
    #[test]
    fn nested_env_override() {
        let config = Config::from_sources(
            None,
            env(&[
                ("VOLCANO_RUNNER_LICENSES__COMSOL__ADDRESS", "10.0.0.7"),
                ("VOLCANO_RUNNER_LICENSES__COMSOL__PORT", "1718"),
                ("VOLCANO_RUNNER_LICENSES__COMSOL__LICENSE", "12345"),
            ]),
        )
        .unwrap();
        let server = &config.licenses["comsol"];
        assert_eq!(server.address, "10.0.0.7");
        assert_eq!(server.port, 1718);
        assert_eq!(server.license.as_ref().map(Secret::expose), Some("12345"));
    }

    /// A whole section as an inline table.
    #[test]
    fn section_as_inline_table() {
        let config = Config::from_sources(
            None,
            env(&[("VOLCANO_RUNNER_LIMITS", "{ max_replicas = 3 }")]),
        )
        .unwrap();
        assert_eq!(config.limits.max_replicas, 3);
    }

    /// Bad values from the environment name the key and the variable.
    #[test]
    fn env_errors() {
        let (key, reason) = invalid(Config::from_sources(
            None,
            env(&[("VOLCANO_RUNNER_LIMITS__MAX_REPLICAS", "lots")]),
        ));
        assert_eq!(key, "limits.max_replicas");
        assert!(reason.contains("lots"), "{reason}");
        assert!(
            reason.ends_with("(set by VOLCANO_RUNNER_LIMITS__MAX_REPLICAS)"),
            "{reason}"
        );

        let (key, reason) = invalid(Config::from_sources(
            None,
            env(&[("VOLCANO_RUNNER_LIMITS__MAX_REPLICA", "3")]),
        ));
        assert_eq!(key, "limits.max_replica");
        assert!(reason.contains("unknown field"), "{reason}");

        let (key, reason) = invalid(Config::from_sources(
            None,
            env(&[("VOLCANO_RUNNER_LIMITS_MAX_REPLICAS", "3")]),
        ));
        assert_eq!(key, "VOLCANO_RUNNER_LIMITS_MAX_REPLICAS");
        assert!(
            reason.contains("VOLCANO_RUNNER_LIMITS__MAX_REPLICAS"),
            "{reason}"
        );

        let (key, _) = invalid(Config::from_sources(
            file("[limits]\nmax_replicas = 8\n"),
            env(&[("VOLCANO_RUNNER_LIMITS__MAX_REPLICAS__X", "3")]),
        ));
        assert_eq!(key, "limits.max_replicas.x");

        let (key, _) = invalid(Config::from_sources(
            None,
            env(&[("VOLCANO_RUNNER_LIMITS____X", "3")]),
        ));
        assert_eq!(key, "VOLCANO_RUNNER_LIMITS____X");
    }

    /// Variables that belong to command-line options are not configuration keys.
    #[test]
    fn cli_variables_are_ignored() {
        let config = Config::from_sources(
            None,
            env(&[
                ("VOLCANO_RUNNER_CONFIG", "/etc/volcano-runner.toml"),
                ("VOLCANO_RUNNER_LOG", "debug"),
            ]),
        )
        .unwrap();
        assert_eq!(config.limits.max_replicas, 64);
    }

    /// The section list is read from the type, so it names every section.
    #[test]
    fn sections_come_from_the_type() {
        let names = section_names();
        for section in [
            "limits", "licenses", "broker", "cluster", "pipeline", "runner", "monitor", "sim",
        ] {
            assert!(names.contains(&section), "{section} missing from {names:?}");
        }
    }
}
