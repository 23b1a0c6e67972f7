//! MultiNode: `/etc/ucloud` in every job, single-replica ones included.
//!
//! | file | content |
//! |---|---|
//! | `rank.txt` | this pod's rank (Volcano's task index) |
//! | `number_of_nodes.txt` | the number of ranks |
//! | `nodes.txt` | every rank's hostname, one per line, in rank order |
//! | `node-<rank>.txt` | one rank's hostname |
//! | `cores.txt` | vCPUs per rank (documented by UCloud, never written: W29) |
//! | `job_id.txt` | the job id (documented by UCloud, never written: W29) |
//!
//! Hostnames are deterministic (`j-<id>-job-<rank>.j-<id>`, from Volcano's `svc` plugin), so every file
//! but `rank.txt` is known when the job is rendered and comes from a per-job ConfigMap `j-<id>-ucloud`.
//! The rank differs per pod: a tiny init container (POSIX sh, image pinned in the configuration, with
//! limits, non-root) copies the ConfigMap's files into the shared `emptyDir` and writes `$VC_TASK_INDEX`
//! (set by Volcano's `env` plugin) to `rank.txt`. It runs once and exits: no loop, no waiting for Volcano's
//! files (UCloud's script spun forever when they never matched, W29). If the index is missing it fails
//! with a message, and the job fails instead of hanging.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{
    Capabilities, ConfigMap, ConfigMapVolumeSource, Container, EmptyDirVolumeSource,
    ResourceRequirements, SecurityContext, Volume, VolumeMount,
};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

use super::{Plugin, PluginId};
use crate::pipeline::context::Context;
use crate::pipeline::desired::Companion;
use crate::pipeline::draft::Draft;
use crate::pipeline::{PipelineError, names};

/// The init container's name (UCloud's).
pub const INIT_CONTAINER: &str = "ucloud-compat";
/// The shared volume mounted at `/etc/ucloud`.
pub const VOLUME: &str = "ucloud-multinode";
/// The ConfigMap volume the init container copies from.
pub const SOURCE_VOLUME: &str = "ucloud-multinode-src";
/// Where users find the files.
pub const MOUNT_PATH: &str = "/etc/ucloud";
/// Where the init container sees the ConfigMap.
pub const SOURCE_PATH: &str = "/etc/ucloud-src";

/// The init container's script: POSIX sh, runs once.
pub const INIT_SCRIPT: &str = "set -eu\n\
cp /etc/ucloud-src/*.txt /etc/ucloud/\n\
printf '%s\\n' \"${VC_TASK_INDEX:?is not set: the Volcano env plugin must be enabled}\" > /etc/ucloud/rank.txt\n";

/// `j-<jobId>-ucloud`, the ConfigMap with the static files.
pub fn config_map_name(job_id: &str) -> String {
    format!("j-{job_id}-ucloud")
}

/// The static files of a job: everything but `rank.txt`.
pub fn static_files(job_id: &str, replicas: u32, cores: u32) -> BTreeMap<String, String> {
    let mut files = BTreeMap::new();
    let mut nodes = String::new();
    for rank in 0..replicas {
        let host = names::rank_hostname(job_id, rank);
        nodes.push_str(&host);
        nodes.push('\n');
        files.insert(format!("node-{rank}.txt"), format!("{host}\n"));
    }
    files.insert("nodes.txt".to_owned(), nodes);
    files.insert("number_of_nodes.txt".to_owned(), format!("{replicas}\n"));
    files.insert("cores.txt".to_owned(), format!("{cores}\n"));
    files.insert("job_id.txt".to_owned(), format!("{job_id}\n"));
    files
}

/// The MultiNode plugin; the module documentation says what it builds and why.
pub struct MultiNode;

impl Plugin for MultiNode {
    fn id(&self) -> PluginId {
        PluginId::MultiNode
    }

    fn build(&self, cx: &Context<'_>, draft: &mut Draft) -> Result<(), PipelineError> {
        let config = &cx.pipeline().multi_node;
        let name = config_map_name(cx.job_id);
        draft.companions.push(Companion::ConfigMap(ConfigMap {
            metadata: ObjectMeta {
                name: Some(name.clone()),
                ..ObjectMeta::default()
            },
            data: Some(static_files(cx.job_id, cx.replicas, cx.product.cpu)),
            ..ConfigMap::default()
        }));
        draft.add_volume(Volume {
            name: VOLUME.to_owned(),
            empty_dir: Some(EmptyDirVolumeSource {
                size_limit: Some(Quantity("16Mi".to_owned())),
                ..EmptyDirVolumeSource::default()
            }),
            ..Volume::default()
        });
        draft.add_volume(Volume {
            name: SOURCE_VOLUME.to_owned(),
            config_map: Some(ConfigMapVolumeSource {
                name: name.clone(),
                ..ConfigMapVolumeSource::default()
            }),
            ..Volume::default()
        });
        let limits = BTreeMap::from([
            ("cpu".to_owned(), Quantity(config.init_cpu.clone())),
            ("memory".to_owned(), Quantity(config.init_memory.clone())),
        ]);
        draft.init.push(Container {
            name: INIT_CONTAINER.to_owned(),
            image: Some(config.init_image.clone()),
            image_pull_policy: Some("IfNotPresent".to_owned()),
            command: Some(vec![
                "/bin/sh".to_owned(),
                "-c".to_owned(),
                INIT_SCRIPT.to_owned(),
            ]),
            resources: Some(ResourceRequirements {
                limits: Some(limits.clone()),
                requests: Some(limits),
                claims: None,
            }),
            security_context: Some(SecurityContext {
                run_as_non_root: Some(true),
                run_as_user: Some(config.init_run_as_user),
                allow_privilege_escalation: Some(false),
                read_only_root_filesystem: Some(true),
                capabilities: Some(Capabilities {
                    drop: Some(vec!["ALL".to_owned()]),
                    add: None,
                }),
                ..SecurityContext::default()
            }),
            volume_mounts: Some(vec![
                VolumeMount {
                    name: VOLUME.to_owned(),
                    mount_path: MOUNT_PATH.to_owned(),
                    read_only: Some(false),
                    ..VolumeMount::default()
                },
                VolumeMount {
                    name: SOURCE_VOLUME.to_owned(),
                    mount_path: SOURCE_PATH.to_owned(),
                    read_only: Some(true),
                    ..VolumeMount::default()
                },
            ]),
            ..Container::default()
        });
        draft.mount(VolumeMount {
            name: VOLUME.to_owned(),
            mount_path: MOUNT_PATH.to_owned(),
            read_only: Some(false),
            ..VolumeMount::default()
        });
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn files_of_a_two_rank_job() {
        let files = static_files("42", 2, 4);
        assert_eq!(files["nodes.txt"], "j-42-job-0.j-42\nj-42-job-1.j-42\n");
        assert_eq!(files["node-1.txt"], "j-42-job-1.j-42\n");
        assert_eq!(files["number_of_nodes.txt"], "2\n");
        assert_eq!(files["cores.txt"], "4\n");
        assert_eq!(files["job_id.txt"], "42\n");
        assert!(!files.contains_key("rank.txt"));
        assert_eq!(files.len(), 2 + 4);
    }

    #[test]
    fn script_is_posix_and_has_no_loop() {
        for bashism in ["[[", "function ", "while", "until", "for ", "sleep", "$'"] {
            assert!(!INIT_SCRIPT.contains(bashism), "{bashism}");
        }
        assert!(INIT_SCRIPT.contains("${VC_TASK_INDEX:?"));
        assert!(INIT_SCRIPT.contains(SOURCE_PATH) && INIT_SCRIPT.contains(MOUNT_PATH));
    }
}
