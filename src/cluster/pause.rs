//! The pause switch: one ConfigMap in the runner's namespace that stops every runner from taking
//! submissions, while cancels and extensions keep flowing.
//!
//! The ConfigMap (`[cluster] pause_configmap`, default `volcano-runner-pause`) holds `paused`
//! (`"true"`/`"false"`), `reason`, `changedAt` and `changedBy`. A missing ConfigMap means "not paused",
//! so a fresh installation runs without setup. `volcano-runner admin pause|resume|status` calls
//! [`PauseSwitch::pause`], [`PauseSwitch::resume`] and [`PauseSwitch::read`]; runners follow it through
//! the [`SubmitGate`](super::SubmitGate), which watches it.
//!
//! Writes are merge patches (create when missing), so two admins pausing at once both succeed and
//! nothing is read-modify-written.

use std::collections::BTreeMap;

use jiff::Timestamp;
use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::{ObjectMeta, Patch, PatchParams, PostParams};

use super::ClusterConfig;
use super::error::{ClusterError, KubeResultExt};
use super::labels::{COMPONENT, FIELD_MANAGER, MANAGED_BY, MANAGER};
use super::records::ConfigMapRecords;

/// `app.kubernetes.io/component` of the pause ConfigMap.
pub const COMPONENT_PAUSE: &str = "pause-switch";

const KEY_PAUSED: &str = "paused";
const KEY_REASON: &str = "reason";
const KEY_CHANGED_AT: &str = "changedAt";
const KEY_CHANGED_BY: &str = "changedBy";

/// Whether submissions are paused, and who said so.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PauseState {
    pub paused: bool,
    /// Why, as the operator wrote it.
    pub reason: Option<String>,
    pub changed_at: Option<Timestamp>,
    pub changed_by: Option<String>,
}

impl PauseState {
    /// Reads the state from the ConfigMap (`None`: no ConfigMap, not paused). A `paused` value that is
    /// not clearly "off" (`false`, `no`, `off`, `0`, empty) counts as paused: a hand-edited switch with a
    /// typo should stop submissions rather than silently let them through.
    pub fn from_configmap(cm: Option<&ConfigMap>) -> Self {
        let Some(data) = cm.and_then(|cm| cm.data.as_ref()) else {
            return Self::default();
        };
        let text = |k: &str| {
            data.get(k)
                .map(|v| v.trim().to_owned())
                .filter(|v| !v.is_empty())
        };
        let paused = match text(KEY_PAUSED) {
            None => false,
            Some(v) => !matches!(
                v.to_ascii_lowercase().as_str(),
                "false" | "no" | "off" | "0"
            ),
        };
        Self {
            paused,
            reason: text(KEY_REASON),
            changed_at: text(KEY_CHANGED_AT).and_then(|v| v.parse().ok()),
            changed_by: text(KEY_CHANGED_BY),
        }
    }

    fn to_data(&self) -> BTreeMap<String, String> {
        let mut data = BTreeMap::from([(KEY_PAUSED.to_owned(), self.paused.to_string())]);
        data.insert(
            KEY_REASON.to_owned(),
            self.reason.clone().unwrap_or_default(),
        );
        if let Some(at) = self.changed_at {
            data.insert(KEY_CHANGED_AT.to_owned(), at.to_string());
        }
        data.insert(
            KEY_CHANGED_BY.to_owned(),
            self.changed_by.clone().unwrap_or_default(),
        );
        data
    }
}

/// Reads and flips the pause switch.
#[derive(Clone)]
pub struct PauseSwitch {
    records: ConfigMapRecords,
    name: String,
}

impl std::fmt::Debug for PauseSwitch {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PauseSwitch")
            .field("namespace", &self.records.namespace())
            .field("name", &self.name)
            .finish_non_exhaustive()
    }
}

impl PauseSwitch {
    /// The switch named `config.pause_configmap` in `config.namespace`.
    pub fn new(client: kube::Client, config: &ClusterConfig) -> Self {
        Self {
            records: ConfigMapRecords::new(client, config),
            name: config.pause_configmap.clone(),
        }
    }

    /// The ConfigMap's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The current state, read from the cluster.
    pub async fn read(&self) -> Result<PauseState, ClusterError> {
        let cm = self.records.get(WHAT, &self.name).await?;
        Ok(PauseState::from_configmap(cm.as_ref()))
    }

    /// Pauses submissions on every runner.
    pub async fn pause(
        &self,
        reason: &str,
        by: &str,
        now: Timestamp,
    ) -> Result<PauseState, ClusterError> {
        self.write(PauseState {
            paused: true,
            reason: Some(reason.to_owned()).filter(|r| !r.is_empty()),
            changed_at: Some(now),
            changed_by: Some(by.to_owned()),
        })
        .await
    }

    /// Lets submissions flow again.
    pub async fn resume(&self, by: &str, now: Timestamp) -> Result<PauseState, ClusterError> {
        self.write(PauseState {
            paused: false,
            reason: None,
            changed_at: Some(now),
            changed_by: Some(by.to_owned()),
        })
        .await
    }

    async fn write(&self, state: PauseState) -> Result<PauseState, ClusterError> {
        let cm = ConfigMap {
            metadata: ObjectMeta {
                name: Some(self.name.clone()),
                namespace: Some(self.records.namespace().to_owned()),
                labels: Some(BTreeMap::from([
                    (MANAGED_BY.to_owned(), MANAGER.to_owned()),
                    (COMPONENT.to_owned(), COMPONENT_PAUSE.to_owned()),
                ])),
                ..ObjectMeta::default()
            },
            data: Some(state.to_data()),
            ..ConfigMap::default()
        };
        let op = self.records.op("write", WHAT, &self.name);
        let api = self.records.api();
        let patch_params = PatchParams {
            field_manager: Some(FIELD_MANAGER.to_owned()),
            ..PatchParams::default()
        };
        let post_params = PostParams {
            field_manager: Some(FIELD_MANAGER.to_owned()),
            ..PostParams::default()
        };
        let stored = self
            .records
            .retry()
            .run(&op, || async {
                let patched = api
                    .patch(&self.name, &patch_params, &Patch::Merge(&cm))
                    .await
                    .classify(|| op.clone());
                match patched {
                    Err(e) if e.is_not_found() => {
                        match api.create(&post_params, &cm).await.classify(|| op.clone()) {
                            // Someone created it between our patch and our create: patch again.
                            Err(e) if e.is_already_exists() => Err(ClusterError::Conflict {
                                op: op.clone(),
                                message: "created concurrently".into(),
                            }),
                            other => other,
                        }
                    }
                    other => other,
                }
            })
            .await?;
        Ok(PauseState::from_configmap(Some(&stored)))
    }
}

/// The record kind, in the operations errors name.
const WHAT: &str = "pause switch";

#[cfg(test)]
mod tests {
    use super::*;

    fn cm(pairs: &[(&str, &str)]) -> ConfigMap {
        ConfigMap {
            data: Some(
                pairs
                    .iter()
                    .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
                    .collect(),
            ),
            ..ConfigMap::default()
        }
    }

    #[test]
    fn a_missing_switch_is_not_paused() {
        assert!(!PauseState::from_configmap(None).paused);
        assert!(!PauseState::from_configmap(Some(&ConfigMap::default())).paused);
        assert!(!PauseState::from_configmap(Some(&cm(&[("paused", "")]))).paused);
    }

    #[test]
    fn only_clear_offs_are_off() {
        for off in ["false", "False", "no", "off", "0", " false "] {
            assert!(
                !PauseState::from_configmap(Some(&cm(&[("paused", off)]))).paused,
                "{off}"
            );
        }
        for on in ["true", "TRUE", "yes", "1", "ture"] {
            assert!(
                PauseState::from_configmap(Some(&cm(&[("paused", on)]))).paused,
                "{on}"
            );
        }
    }

    #[test]
    fn state_round_trips_through_data() {
        let state = PauseState {
            paused: true,
            reason: Some("maintenance until 14:00".into()),
            changed_at: Some("2026-03-01T12:00:00Z".parse().unwrap()),
            changed_by: Some("alice".into()),
        };
        let back = PauseState::from_configmap(Some(&ConfigMap {
            data: Some(state.to_data()),
            ..ConfigMap::default()
        }));
        assert_eq!(back, state);
    }
}
