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
//! but `rank.txt` is known when the job is rendered. A tiny init container (POSIX sh, image pinned in the
//! configuration, with limits, non-root) writes them all into the shared `emptyDir` from its own
//! environment (the job id, the number of ranks, the vCPUs and the two halves of a rank's host name, set
//! at render time) and `rank.txt` from `$VC_TASK_INDEX` (set by Volcano's `env` plugin). No object of its
//! own: an earlier version copied the files from a per-job ConfigMap, one more API create (and delete)
//! per job for data the pod spec can carry. It runs once and exits: no waiting for Volcano's files
//! (UCloud's script spun forever when they never matched, W29). If the index is missing it fails with a
//! message, and the job fails instead of hanging. [`static_files`] is what it writes, for the tests.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::EnvVar;

use super::{Plugin, PluginId};
use crate::pipeline::context::Context;
use crate::pipeline::draft::{Draft, Helper};
use crate::pipeline::{PipelineError, names};

/// The init container's name (UCloud's).
pub const INIT_CONTAINER: &str = "ucloud-compat";
/// The shared volume mounted at `/etc/ucloud`.
pub const VOLUME: &str = "ucloud-multinode";
/// Where users find the files.
pub const MOUNT_PATH: &str = "/etc/ucloud";

/// The init container's script: POSIX sh, runs once; its inputs are the `UCLOUD_*` variables the plugin
/// sets on the container, and `VC_TASK_INDEX`.
pub const INIT_SCRIPT: &str = r#"set -eu
rank="${VC_TASK_INDEX:?is not set: the Volcano env plugin must be enabled}"
out=/etc/ucloud
: > "$out/nodes.txt"
i=0
while [ "$i" -lt "$UCLOUD_REPLICAS" ]; do
  host="$UCLOUD_HOST_PREFIX$i$UCLOUD_HOST_SUFFIX"
  printf '%s\n' "$host" >> "$out/nodes.txt"
  printf '%s\n' "$host" > "$out/node-$i.txt"
  i=$((i + 1))
done
printf '%s\n' "$UCLOUD_REPLICAS" > "$out/number_of_nodes.txt"
printf '%s\n' "$UCLOUD_CORES" > "$out/cores.txt"
printf '%s\n' "$UCLOUD_JOB_ID" > "$out/job_id.txt"
printf '%s\n' "$rank" > "$out/rank.txt"
"#;

/// The init container's environment: what [`INIT_SCRIPT`] writes the files from.
pub fn init_env(job_id: &str, replicas: u32, cores: u32) -> Vec<EnvVar> {
    // `<prefix><rank><suffix>` is the rank's host name (names::rank_hostname).
    let probe = names::rank_hostname(job_id, 0);
    let (prefix, suffix) = probe
        .split_once("0.")
        .map(|(p, s)| (p.to_owned(), format!(".{s}")))
        .unwrap_or_default();
    [
        ("UCLOUD_JOB_ID", job_id.to_owned()),
        ("UCLOUD_REPLICAS", replicas.to_string()),
        ("UCLOUD_CORES", cores.to_string()),
        ("UCLOUD_HOST_PREFIX", prefix),
        ("UCLOUD_HOST_SUFFIX", suffix),
    ]
    .into_iter()
    .map(|(name, value)| EnvVar {
        name: name.to_owned(),
        value: Some(value),
        value_from: None,
    })
    .collect()
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
        draft.add_helper(Helper {
            name: INIT_CONTAINER,
            image: config.init_image.clone(),
            command: vec![
                "/bin/sh".to_owned(),
                "-c".to_owned(),
                INIT_SCRIPT.to_owned(),
            ],
            env: Some(init_env(cx.job_id, cx.replicas, cx.product.cpu)),
            cpu: config.init_cpu.clone(),
            memory: config.init_memory.clone(),
            run_as_user: config.init_run_as_user,
            volume: VOLUME,
            mount_path: MOUNT_PATH,
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
    fn script_is_posix_and_never_waits() {
        for bashism in ["[[", "function ", "until", "for ", "sleep", "$'", "local "] {
            assert!(!INIT_SCRIPT.contains(bashism), "{bashism}");
        }
        // One loop, over the ranks, bounded by their number: nothing waits for anything.
        assert_eq!(INIT_SCRIPT.matches("while").count(), 1);
        assert!(INIT_SCRIPT.contains(r#"while [ "$i" -lt "$UCLOUD_REPLICAS" ]; do"#));
        assert!(INIT_SCRIPT.contains("${VC_TASK_INDEX:?"));
        assert!(INIT_SCRIPT.contains(MOUNT_PATH));
    }

    #[test]
    fn the_environment_names_every_input_of_the_script() {
        let env = init_env("42", 3, 8);
        let value = |name: &str| {
            env.iter()
                .find(|e| e.name == name)
                .and_then(|e| e.value.clone())
                .unwrap()
        };
        assert_eq!(value("UCLOUD_HOST_PREFIX"), "j-42-job-");
        assert_eq!(value("UCLOUD_HOST_SUFFIX"), ".j-42");
        assert_eq!(value("UCLOUD_REPLICAS"), "3");
        assert_eq!(value("UCLOUD_CORES"), "8");
        assert_eq!(value("UCLOUD_JOB_ID"), "42");
        for e in &env {
            assert!(INIT_SCRIPT.contains(&format!("${}", e.name)), "{}", e.name);
        }
    }
}
