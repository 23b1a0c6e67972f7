//! `[proxy_sync]`: the settings of the proxy-sync role (`volcano-runner proxy-sync`, [`crate::proxy`]).
//! Where routes are published (`<prefix><jobId>-<rank>.<domain>`) is `[pipeline.proxy]`, shared with the
//! runners.

use std::path::PathBuf;
use std::time::Duration;

use serde::Deserialize;

/// The `[proxy_sync]` section.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ProxySyncConfig {
    /// Where the Envoy configuration is written (`bootstrap.json`, `lds.json`, `rds.json`, `cds.json`);
    /// empty: no files, the route table only.
    pub envoy_dir: PathBuf,
    /// The port of Envoy's HTTP listener.
    pub listen_port: u16,
    /// How long Envoy waits for a pod to accept a connection.
    #[serde(with = "duration::required")]
    pub connect_timeout: Duration,
    /// Changes within this interval are written to the Envoy files together.
    #[serde(with = "duration::required")]
    pub coalesce: Duration,
    /// How many proxy events may be in flight to this instance at once.
    pub prefetch: u16,
    /// How long a removed job is remembered, so that an event about it that arrives late cannot bring
    /// its routes back.
    #[serde(with = "duration::required")]
    pub removed_retention: Duration,
    /// Where the session check (`/authz`, for the proxy's forward_auth / ext_authz) listens; empty: not
    /// served.
    pub authz_listen: String,
    /// The largest request head the session check reads (at least 8 KiB); a larger one is answered 431.
    pub authz_max_header_bytes: usize,
}

mod duration {
    pub use jiff::fmt::serde::unsigned_duration::friendly::compact::required;
}

impl Default for ProxySyncConfig {
    fn default() -> Self {
        Self {
            envoy_dir: PathBuf::new(),
            listen_port: 8080,
            connect_timeout: Duration::from_secs(5),
            coalesce: Duration::from_millis(100),
            prefetch: 256,
            removed_retention: Duration::from_secs(3600),
            authz_listen: String::new(),
            authz_max_header_bytes: 16 * 1024,
        }
    }
}

/// A `[proxy_sync]` setting that cannot work: the key and why.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("configuration {key}: {reason}")]
pub struct ProxySyncConfigError {
    pub key: String,
    pub reason: String,
}

impl ProxySyncConfig {
    /// Checks what serde cannot.
    pub fn check(&self) -> Result<(), ProxySyncConfigError> {
        let invalid = |key: &str, reason: &str| ProxySyncConfigError {
            key: format!("proxy_sync.{key}"),
            reason: reason.to_owned(),
        };
        if self.listen_port == 0 {
            return Err(invalid("listen_port", "must be 1 to 65535"));
        }
        if self.prefetch == 0 {
            return Err(invalid(
                "prefetch",
                "must be at least 1 (0 would mean unlimited)",
            ));
        }
        if self.connect_timeout.is_zero() {
            return Err(invalid("connect_timeout", "must be longer than zero"));
        }
        if self.removed_retention.is_zero() {
            return Err(invalid(
                "removed_retention",
                "must be longer than zero, or a late CREATE could bring a removed job back",
            ));
        }
        if !self.authz_listen.is_empty()
            && self.authz_listen.parse::<std::net::SocketAddr>().is_err()
        {
            return Err(invalid(
                "authz_listen",
                "must be an address and port such as 127.0.0.1:9190, or empty",
            ));
        }
        if !(8192..=1024 * 1024).contains(&self.authz_max_header_bytes) {
            return Err(invalid("authz_max_header_bytes", "must be 8192 to 1048576"));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bad_values_name_the_key() {
        let c = ProxySyncConfig {
            prefetch: 0,
            ..ProxySyncConfig::default()
        };
        assert_eq!(c.check().unwrap_err().key, "proxy_sync.prefetch");
        let c: ProxySyncConfig = toml::from_str("coalesce = \"250ms\"").unwrap();
        assert_eq!(c.coalesce, Duration::from_millis(250));
        let e = toml::from_str::<ProxySyncConfig>("colaesce = \"250ms\"").unwrap_err();
        assert!(e.to_string().contains("colaesce"), "{e}");
        ProxySyncConfig::default().check().unwrap();
    }
}
