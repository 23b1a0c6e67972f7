//! Building the Kubernetes client for the configured target.
//!
//! The client is tuned the same way for every target:
//! - the connect timeout comes from the configuration, so a dead endpoint fails fast;
//! - no global read timeout, because it would cut idle watches; each request is bounded by
//!   [`RetryPolicy`](super::RetryPolicy)'s `request_timeout` instead;
//! - kube's built-in retry layer is off. It would retry 429/503/504 up to 15 times with waits of up to
//!   1000 s inside a single call, hiding the outage from our bounded budget (which must end in a requeue,
//!   not in a call that hangs for minutes).

use std::fmt;

use kube::config::KubeConfigOptions;
use serde::Deserialize;

use super::{ClusterConfig, ClusterError, KubeResultExt};

/// Which API server to talk to (`[cluster] target`).
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(try_from = "String")]
pub enum ClusterTarget {
    /// In-cluster service account when running in a pod, else `KUBECONFIG` (or `~/.kube/config`).
    Auto,
    /// The embedded simulator: the caller starts it and connects with [`connect_url`].
    Sim,
    /// An explicit API server URL. Plain `http://` is fine for a simulator or `kubectl proxy`.
    Url(http::Uri),
}

impl TryFrom<String> for ClusterTarget {
    type Error = String;

    fn try_from(value: String) -> Result<Self, Self::Error> {
        match value.as_str() {
            "auto" => Ok(Self::Auto),
            "sim" => Ok(Self::Sim),
            url if url.starts_with("http://") || url.starts_with("https://") => url
                .parse::<http::Uri>()
                .map(Self::Url)
                .map_err(|e| format!("{url:?} is not a valid URL: {e}")),
            other => Err(format!(
                "{other:?} is not a cluster target: use \"auto\", \"sim\" or an http(s):// URL"
            )),
        }
    }
}

impl fmt::Display for ClusterTarget {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Auto => f.write_str("auto"),
            Self::Sim => f.write_str("sim"),
            Self::Url(url) => write!(f, "{url}"),
        }
    }
}

/// Connects to the configured target. For [`ClusterTarget::Sim`] the caller starts the simulator first
/// and uses [`connect_url`]; asking this function for it is an error that says so.
pub async fn connect(config: &ClusterConfig) -> Result<kube::Client, ClusterError> {
    match &config.target {
        ClusterTarget::Auto => {
            let kube_config = infer().await?;
            build(kube_config, config)
        }
        ClusterTarget::Sim => Err(ClusterError::Config(
            "target \"sim\" needs the embedded simulator to be started first; connect to its URL"
                .into(),
        )),
        ClusterTarget::Url(url) => connect_url(url.clone(), config),
    }
}

/// Connects to an explicit URL (a simulator, `kubectl proxy`), with the configured timeouts.
pub fn connect_url(url: http::Uri, config: &ClusterConfig) -> Result<kube::Client, ClusterError> {
    build(kube::Config::new(url), config)
}

/// [`connect`], with every API request reported through `observe` (metrics by verb and resource, and
/// the call recorder of the RBAC test).
pub async fn connect_with(
    config: &ClusterConfig,
    observe: &crate::ops::KubeCallLayer,
) -> Result<kube::Client, ClusterError> {
    match &config.target {
        ClusterTarget::Auto => build_with(infer().await?, config, observe),
        ClusterTarget::Url(url) => build_with(kube::Config::new(url.clone()), config, observe),
        ClusterTarget::Sim => connect(config).await,
    }
}

/// [`connect_url`], with every API request reported through `observe`.
pub fn connect_url_with(
    url: http::Uri,
    config: &ClusterConfig,
    observe: &crate::ops::KubeCallLayer,
) -> Result<kube::Client, ClusterError> {
    build_with(kube::Config::new(url), config, observe)
}

fn build_with(
    mut kube_config: kube::Config,
    config: &ClusterConfig,
    observe: &crate::ops::KubeCallLayer,
) -> Result<kube::Client, ClusterError> {
    tune(&mut kube_config, config);
    let builder = kube::client::ClientBuilder::try_from(kube_config)
        .map_err(|e| ClusterError::Config(e.to_string()))?;
    Ok(builder.with_layer(observe).build())
}

/// Asks the API server for its version: a cheap check at start that the target is reachable and we are
/// allowed in, so a broken setup fails the process instead of every job.
pub async fn probe(client: &kube::Client) -> Result<String, ClusterError> {
    let info = client
        .apiserver_version()
        .await
        .classify(|| "GET /version".to_owned())?;
    Ok(info.git_version)
}

/// In-cluster first (a pod's own service account is what an operator deployed it with), then the
/// kubeconfig from `KUBECONFIG` or `~/.kube/config`.
async fn infer() -> Result<kube::Config, ClusterError> {
    match kube::Config::incluster() {
        Ok(c) => Ok(c),
        Err(in_cluster) => kube::Config::from_kubeconfig(&KubeConfigOptions::default())
            .await
            .map_err(|kubeconfig| {
                ClusterError::Config(format!(
                    "no cluster found: not in a pod ({in_cluster}) and no usable kubeconfig \
                     ({kubeconfig}); set KUBECONFIG, or use the simulator with --cluster sim \
                     ([cluster] target = \"sim\"): `run` starts one inside the runner, and \
                     `admin` reaches the one of the runner started so on this machine"
                ))
            }),
    }
}

fn build(
    mut kube_config: kube::Config,
    config: &ClusterConfig,
) -> Result<kube::Client, ClusterError> {
    tune(&mut kube_config, config);
    kube::Client::try_from(kube_config).map_err(|e| ClusterError::Config(e.to_string()))
}

/// Applies our settings to a kube configuration (see the module documentation for why).
fn tune(kube_config: &mut kube::Config, config: &ClusterConfig) {
    kube_config.connect_timeout = Some(config.connect_timeout);
    kube_config.read_timeout = None;
    kube_config.default_retry = false;
    kube_config.default_namespace = config.namespace.clone();
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    #[test]
    fn targets_parse() {
        assert_eq!(
            ClusterTarget::try_from("auto".to_owned()),
            Ok(ClusterTarget::Auto)
        );
        assert_eq!(
            ClusterTarget::try_from("sim".to_owned()),
            Ok(ClusterTarget::Sim)
        );
        let url = ClusterTarget::try_from("http://127.0.0.1:6443".to_owned()).unwrap();
        assert_eq!(url.to_string(), "http://127.0.0.1:6443/");
        assert!(ClusterTarget::try_from("cluster.local".to_owned()).is_err());
        assert!(ClusterTarget::try_from("http://a b".to_owned()).is_err());
    }

    #[test]
    fn tuning_turns_off_the_hidden_retries() {
        let mut kube_config = kube::Config::new("http://127.0.0.1:1".parse().unwrap());
        assert!(
            kube_config.default_retry,
            "kube's default changed; revisit tune()"
        );
        let config = ClusterConfig {
            connect_timeout: Duration::from_millis(750),
            namespace: "ops".into(),
            ..ClusterConfig::default()
        };
        tune(&mut kube_config, &config);
        assert!(!kube_config.default_retry);
        assert_eq!(
            kube_config.connect_timeout,
            Some(Duration::from_millis(750))
        );
        assert_eq!(kube_config.read_timeout, None);
        assert_eq!(kube_config.default_namespace, "ops");
    }

    #[tokio::test]
    async fn the_sim_target_must_be_started_by_the_caller() {
        let config = ClusterConfig {
            target: ClusterTarget::Sim,
            ..ClusterConfig::default()
        };
        let Err(err) = connect(&config).await else {
            panic!("connected without a simulator");
        };
        assert!(err.to_string().contains("simulator"), "{err}");
    }

    #[tokio::test]
    async fn a_refused_connection_is_retryable() {
        // Port 1 on loopback: nothing listens there, so the connection is refused at once.
        let client = connect_url(
            "http://127.0.0.1:1".parse().unwrap(),
            &ClusterConfig::default(),
        )
        .unwrap();
        let err = probe(&client).await.unwrap_err();
        assert!(err.is_retryable(), "{err:?}");
    }
}
