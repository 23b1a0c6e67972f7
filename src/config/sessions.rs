//! `[sessions]`: interactive sessions ([`crate::sessions`]): how long they live, how their URLs are
//! made, and how often the runners sweep their records.

use std::time::Duration;

use serde::Deserialize;

/// The `[sessions]` section.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct SessionsConfig {
    /// The lifetime of a session whose request names none.
    #[serde(with = "duration::required")]
    pub default_lifetime: Duration,
    /// The longest lifetime; a longer request is shortened to it.
    #[serde(with = "duration::required")]
    pub max_lifetime: Duration,
    /// The scheme of session URLs, `https` or `http`; with `https` the cookie is `Secure`.
    pub scheme: String,
    /// How often a runner sweeps the session records (expired ones, and those of ended jobs).
    #[serde(with = "duration::required")]
    pub sweep_interval: Duration,
    /// How many records one sweep looks at, at most (the next sweep goes on from there).
    pub sweep_batch: u32,
    /// How many session requests may be in flight to one runner.
    pub prefetch: u16,
    /// Origins besides each rank's own (`<scheme>://<rank host>`) whose pages may use a session: open
    /// a bridge's WebSocket, send a state-changing request, fetch with credentials. The orchestrator's
    /// web frontend, if it talks to the jobs from its pages (`https://cloud.sdu.dk`). Empty by default.
    pub allowed_origins: Vec<String>,
}

mod duration {
    pub use jiff::fmt::serde::unsigned_duration::friendly::compact::required;
}

impl Default for SessionsConfig {
    fn default() -> Self {
        Self {
            default_lifetime: Duration::from_secs(8 * 3600),
            max_lifetime: Duration::from_secs(24 * 3600),
            scheme: "https".into(),
            sweep_interval: Duration::from_secs(60),
            sweep_batch: 500,
            prefetch: 32,
            allowed_origins: Vec::new(),
        }
    }
}

/// A `[sessions]` setting that cannot work: the key and why.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("configuration {key}: {reason}")]
pub struct SessionsConfigError {
    pub key: String,
    pub reason: String,
}

impl SessionsConfig {
    /// Checks what serde cannot.
    pub fn check(&self) -> Result<(), SessionsConfigError> {
        let invalid = |key: &str, reason: &str| SessionsConfigError {
            key: format!("sessions.{key}"),
            reason: reason.to_owned(),
        };
        if self.default_lifetime.is_zero() {
            return Err(invalid("default_lifetime", "must be longer than zero"));
        }
        if self.max_lifetime < self.default_lifetime {
            return Err(invalid(
                "max_lifetime",
                "must be at least sessions.default_lifetime",
            ));
        }
        if self.scheme != "https" && self.scheme != "http" {
            return Err(invalid("scheme", "must be \"https\" or \"http\""));
        }
        if self.sweep_interval.is_zero() {
            return Err(invalid("sweep_interval", "must be longer than zero"));
        }
        if self.sweep_batch == 0 {
            return Err(invalid("sweep_batch", "must be at least 1"));
        }
        for (i, origin) in self.allowed_origins.iter().enumerate() {
            let normalized = crate::validate::names::normalize_origin(origin);
            if normalized.is_none() {
                return Err(invalid(
                    &format!("allowed_origins[{i}]"),
                    &format!(
                        "{origin:?} is not an origin: write scheme://host[:port] as a browser sends it \
                         (\"https://cloud.sdu.dk\"), with no path, and never \"null\""
                    ),
                ));
            }
        }
        if self.prefetch == 0 {
            return Err(invalid(
                "prefetch",
                "must be at least 1 (0 would mean unlimited)",
            ));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bad_values_name_the_key() {
        SessionsConfig::default().check().unwrap();
        let c: SessionsConfig = toml::from_str("scheme = \"ftp\"").unwrap();
        assert_eq!(c.check().unwrap_err().key, "sessions.scheme");
        let c: SessionsConfig = toml::from_str("max_lifetime = \"1h\"").unwrap();
        assert_eq!(c.check().unwrap_err().key, "sessions.max_lifetime");
        assert!(toml::from_str::<SessionsConfig>("lifetime = \"1h\"").is_err());
        let c: SessionsConfig =
            toml::from_str("allowed_origins = [\"https://cloud.sdu.dk\", \"null\"]").unwrap();
        let e = c.check().unwrap_err();
        assert_eq!(e.key, "sessions.allowed_origins[1]");
        assert!(e.reason.contains("never \"null\""), "{e}");
        let c: SessionsConfig =
            toml::from_str("allowed_origins = [\"https://cloud.sdu.dk/app\"]").unwrap();
        assert_eq!(c.check().unwrap_err().key, "sessions.allowed_origins[0]");
        let c: SessionsConfig =
            toml::from_str("allowed_origins = [\"https://cloud.sdu.dk\"]").unwrap();
        c.check().unwrap();
    }
}
