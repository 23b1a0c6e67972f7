//! Traced jobs: every process of the job has its system calls (process, file and network calls, and the
//! kill family, with arguments and results) recorded, per rank, where the job cannot change them.
//!
//! A job is traced when its submission asks (`traced`) or the operator traces every job of its product
//! or project (`[pipeline.traced]`). Called by FileMount, after the output wrapper. For a traced job:
//!
//! - The pod shares one process namespace (`shareProcessNamespace`), and gets a second container,
//!   [`TRACER_CONTAINER`] (`[pipeline.traced] image`, Debian's `strace`), that alone holds
//!   `CAP_SYS_PTRACE` and alone mounts the trace folder read-write. It runs [`TRACER`] (POSIX sh, run by
//!   the output wrapper's busybox, so only `strace` comes from the image).
//! - The user's command is prefixed with [`GATE`]: it hands its own pid to the tracer (through the
//!   busybox volume both containers mount) and waits until it is traced (its `TracerPid` in
//!   `/proc/self/status`) before it `exec`s the application, so nothing of the application runs
//!   untraced. If the tracer does not attach within `attach_seconds`, the job fails (exit 126) instead
//!   of running untraced.
//! - The tracer runs `strace -f -tt -I4 -e trace=... -p <pid>`: it follows every fork, ignores the
//!   SIGTERM of a cancel or an expiry (so it records the application's last calls and its end), and ends
//!   when the last traced process has ended. Its output goes through a bound: the first `max_bytes`
//!   bytes are kept, then a marker line ([`KEPT`]'s); the rest is read and dropped so the traced
//!   processes never stall on a full pipe.
//! - The trace is written line by line as the job runs (strace writes each line at once), so it is
//!   complete at every end: a normal end, a cancel, an expiry, a runner killed meanwhile. After a kill at
//!   the end of the grace period it holds every call up to that moment.
//! - Where: `<outputFolder>/trace/trace-<rank>.txt`, which the user's container sees as a read-only
//!   mount of its own (`/work/trace`, over the read-write output folder: a mount point cannot be
//!   removed or renamed, and a read-only bind mount cannot be written, even by root); or, with
//!   `[pipeline.traced] folder`, `<folder>/<jobId>/`, which the user's container does not mount at all.
//!   The terminal event names the files.
//!
//! docs/pipeline.md says why this mechanism (and not a gVisor RuntimeClass or a node agent), what a
//! trace guarantees and what it does not, and what tracing costs.

use k8s_openapi::api::core::v1::{
    Capabilities, Container, PersistentVolumeClaimVolumeSource, ResourceRequirements,
    SecurityContext, Volume, VolumeMount,
};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use serde::Deserialize;
use std::collections::BTreeMap;

use crate::messages::v1::KeptTrace;
use crate::pipeline::PipelineError;
use crate::pipeline::context::Context;
use crate::pipeline::draft::Draft;
use crate::pipeline::kept::PerRank;
use crate::pipeline::mounts::{VOLUME as DATA_VOLUME, WORK};
use crate::pipeline::plugins::output_files::{self, HELPER_DIR};

/// How a job is traced. One mechanism today; the key exists so that a configuration names its choice
/// and a later one (docs/pipeline.md weighs gVisor) is a new value, not a new section.
#[derive(Debug, Clone, Copy, Deserialize, PartialEq, Eq, Default)]
#[serde(rename_all = "kebab-case")]
pub enum Mechanism {
    /// `strace` in a sidecar that shares the pod's process namespace.
    #[default]
    Strace,
}

/// `[pipeline.traced]`: which jobs are traced besides those that ask, and how.
#[derive(Debug, Clone, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields, default)]
pub struct TracedConfig {
    /// Product ids or categories whose every job is traced (registry data, health records).
    pub products: Vec<String>,
    /// Projects whose every job is traced.
    pub projects: Vec<String>,
    /// How jobs are traced.
    pub mechanism: Mechanism,
    /// A storage folder for every trace (`<folder>/<jobId>/`), outside any job's output folder, so the
    /// job's container does not even mount it. Empty: `<outputFolder>/trace/`, mounted read-only in the
    /// job's container.
    pub folder: String,
    /// The tracer's image: `strace` at `strace`, pinned by tag or digest. The default is the one
    /// `deploy/images/tracer/Dockerfile` builds, under the tag its comment gives.
    pub image: String,
    /// Where `strace` is in that image.
    pub strace: String,
    /// The first this many bytes of each rank's trace are kept; a marker line says where it was cut.
    pub max_bytes: u64,
    /// Each string argument (a path, a buffer) is recorded up to this many bytes.
    pub string_bytes: u32,
    /// How long the job waits for its tracer to attach (the tracer's image pull included) before it
    /// fails rather than run untraced.
    pub attach_seconds: u32,
    /// CPU of the tracer (strace's share of the tracing cost).
    pub cpu: String,
    /// Memory of the tracer.
    pub memory: String,
}

impl Default for TracedConfig {
    fn default() -> Self {
        Self {
            products: Vec::new(),
            projects: Vec::new(),
            mechanism: Mechanism::Strace,
            folder: String::new(),
            image: "volcano-runner-tracer:6.1".into(),
            strace: "/usr/bin/strace".into(),
            max_bytes: 256 * 1024 * 1024,
            string_bytes: 256,
            attach_seconds: 600,
            cpu: "500m".into(),
            memory: "128Mi".into(),
        }
    }
}

/// The tracer container.
pub const TRACER_CONTAINER: &str = "volcano-runner-tracer";
/// `$0` of the tracer script: how the simulator (and a reader of the pod spec) recognises it.
pub const TRACER_NAME: &str = "volcano-runner-tracer";
/// `$0` of the gate in front of the application.
pub const GATE_NAME: &str = "volcano-runner-traced";
/// Where the tracer container sees the trace folder.
pub const TRACE_MOUNT: &str = "/.volcano-runner-trace";
/// The trace folder inside the output folder.
pub const SUBFOLDER: &str = "trace";
/// The annotation (under the prefix) saying why the job is traced.
pub const TRACED_ANNOTATION: &str = "traced";
/// The system calls recorded: strace's classes, and the kill family, so that a job that signals its
/// tracer leaves that attempt in the trace.
pub const CALLS: &str = "process,file,network,kill,tkill,tgkill";

/// The traces: recorded in the annotations `traceFolder` and `traceMaxBytes` (under the prefix), cut
/// with the marker `[volcano-runner: trace cut here: ...]`.
pub const KEPT: PerRank = PerRank {
    what: "trace",
    folder_annotation: "traceFolder",
    max_bytes_annotation: "traceMaxBytes",
    file_name,
};

/// The gate, POSIX sh run by busybox in the user's container. `$1` busybox (its folder is shared with
/// the tracer), `$2` how many tenths of a second to wait for the tracer, the rest the application's
/// argv. Without `$(` and `$$` (Kubernetes rewrites them in a command); its own pid comes from
/// `/proc/self/stat`, read by the shell itself.
pub const GATE: &str = r#"b=$1 wait=$2
shift 2
h=${b%/*}
read -r pid rest </proc/self/stat
if ! { echo "$pid" >"$h/trace-pid.new" && "$b" mv "$h/trace-pid.new" "$h/trace-pid"; } 2>/dev/null; then
  echo "volcano-runner: this job is traced, and it cannot reach its tracer ($h); it does not run untraced" >&2
  exit 126
fi
n=
while :; do
  t=0
  while read -r k v; do
    if [ "$k" = TracerPid: ]; then t=$v; fi
  done </proc/self/status
  if [ "$t" != 0 ]; then break; fi
  n=$n.
  if [ ${#n} -gt "$wait" ]; then
    echo "volcano-runner: this job is traced, and its tracer did not attach; it does not run untraced" >&2
    exit 126
  fi
  "$b" sleep 0.1
done
exec "$@"
"#;

/// The tracer, POSIX sh run by busybox in the tracer container. `$1` busybox (its folder holds the
/// gate's pid), `$2` strace, `$3` the trace folder, `$4` the bound, `$5` the longest string recorded,
/// `$6` how many tenths of a second to wait for the gate, `$7` the calls. It ignores SIGTERM: it ends
/// when the traced processes have ended, whatever ended them.
pub const TRACER: &str = r#"b=$1 strace=$2 dir=$3 max=$4 s=$5 wait=$6 calls=$7
h=${b%/*}
r=${VC_TASK_INDEX:-0}
f=$dir/trace-$r.txt
trap '' TERM INT HUP
n=
while [ ! -s "$h/trace-pid" ]; do
  n=$n.
  if [ ${#n} -gt "$wait" ]; then
    echo "[volcano-runner: the application never started: nothing was traced]" >"$f"
    exit 0
  fi
  "$b" sleep 0.1
done
read -r pid <"$h/trace-pid"
"$b" rm -f "$h/trace-pid"
"$strace" -f -tt -I4 -s "$s" -e trace="$calls" -o /dev/fd/3 -p "$pid" 3>&1 1>&2 </dev/null | {
  "$b" dd bs=65536 count="$max" iflag=count_bytes 2>/dev/null
  if [ "`"$b" dd bs=1 count=1 2>/dev/null | "$b" wc -c`" -gt 0 ]; then
    printf '\n[volcano-runner: trace cut here: only the first %s bytes of this rank'"'"'s trace are kept]\n' "$max"
    "$b" cat >/dev/null
  fi
} >"$f"
"#;

/// A rank's trace file name.
pub fn file_name(rank: u32) -> String {
    format!("trace-{rank}.txt")
}

/// Why the job is traced, in words for `job <id>`; `None` when it is not.
pub fn why(cx: &Context<'_>) -> Option<String> {
    let config = &cx.pipeline().traced;
    if cx.job.traced {
        return Some("asked by the submission".to_owned());
    }
    let product = cx.product;
    if let Some(p) = config
        .products
        .iter()
        .find(|p| **p == product.id || **p == product.category)
    {
        return Some(format!("every job of product {p} is traced"));
    }
    let project = cx.owner.project.as_deref().filter(|p| !p.is_empty())?;
    config
        .projects
        .iter()
        .any(|p| p == project)
        .then(|| format!("every job of project {project} is traced"))
}

/// The field a refusal names: the submission's `traced`, or the operator's policy.
fn field(cx: &Context<'_>) -> &'static str {
    if cx.job.traced {
        "traced"
    } else {
        "traced (by [pipeline.traced])"
    }
}

fn check_config(config: &TracedConfig) -> Result<(), PipelineError> {
    if config.max_bytes == 0 {
        return Err(PipelineError::config(
            "traced.max_bytes",
            "must be at least 1",
        ));
    }
    if config.image.trim().is_empty() {
        return Err(PipelineError::config(
            "traced.image",
            "must name an image with strace",
        ));
    }
    if !config.strace.starts_with('/') {
        return Err(PipelineError::config(
            "traced.strace",
            "must be an absolute path in the tracer's image",
        ));
    }
    if !config.folder.is_empty() && !config.folder.starts_with('/') {
        return Err(PipelineError::config(
            "traced.folder",
            "must be an absolute storage path",
        ));
    }
    Ok(())
}

/// Where the trace lands: the storage path and the subPath inside the claim.
fn place(cx: &Context<'_>) -> Result<(String, String), PipelineError> {
    let config = &cx.pipeline().traced;
    if !config.folder.is_empty() {
        let folder = format!("{}/{}", config.folder.trim_end_matches('/'), cx.job_id);
        let subfolder = cx.pipeline().storage.subfolder.trim_matches('/');
        let relative = folder.trim_start_matches('/');
        let sub_path = if subfolder.is_empty() {
            relative.to_owned()
        } else {
            format!("{subfolder}/{relative}")
        };
        return Ok((folder, sub_path));
    }
    let Some(output) = cx.mounts.output.as_ref() else {
        return Err(PipelineError::invalid(
            field(cx),
            "a traced job needs an outputFolder to hold its trace (or the operator's [pipeline.traced] folder)",
        ));
    };
    Ok((
        format!("{}/{SUBFOLDER}", output.path.trim_end_matches('/')),
        format!("{}/{SUBFOLDER}", output.sub_path.trim_end_matches('/')),
    ))
}

/// Puts the gate in front of the application's argv: inside the output wrapper when there is one, so
/// the wrapper (the runner's, not the job's) is not traced and the application's output is still kept.
fn gate(draft: &mut Draft, busybox: &str, wait: u32, field: &str) -> Result<(), PipelineError> {
    let Some(command) = draft.user.command.as_mut().filter(|c| !c.is_empty()) else {
        return Err(PipelineError::invalid(
            field,
            "the application has no command (it runs its image's entrypoint), so it cannot be traced",
        ));
    };
    let at = output_files::unwrap(command).map_or(0, |w| command.len() - w.argv.len());
    let prefix = [
        busybox.to_owned(),
        "sh".to_owned(),
        "-c".to_owned(),
        GATE.to_owned(),
        GATE_NAME.to_owned(),
        busybox.to_owned(),
        (u64::from(wait) * 10).to_string(),
    ];
    command.splice(at..at, prefix);
    Ok(())
}

/// The tracer container.
fn tracer(config: &TracedConfig, busybox: &str, sub_path: String) -> Container {
    let limits = BTreeMap::from([
        ("cpu".to_owned(), Quantity(config.cpu.clone())),
        ("memory".to_owned(), Quantity(config.memory.clone())),
    ]);
    Container {
        name: TRACER_CONTAINER.to_owned(),
        image: Some(config.image.clone()),
        image_pull_policy: Some("IfNotPresent".to_owned()),
        command: Some(vec![
            busybox.to_owned(),
            "sh".to_owned(),
            "-c".to_owned(),
            TRACER.to_owned(),
            TRACER_NAME.to_owned(),
            busybox.to_owned(),
            config.strace.clone(),
            TRACE_MOUNT.to_owned(),
            config.max_bytes.to_string(),
            config.string_bytes.to_string(),
            (u64::from(config.attach_seconds) * 10).to_string(),
            CALLS.to_owned(),
        ]),
        resources: Some(ResourceRequirements {
            limits: Some(limits.clone()),
            requests: Some(limits),
            claims: None,
        }),
        // Root with CAP_SYS_PTRACE alone: it may trace the job's processes whatever their uid, and a
        // job that does not run as root can neither signal it nor write its files.
        security_context: Some(SecurityContext {
            run_as_user: Some(0),
            run_as_non_root: Some(false),
            allow_privilege_escalation: Some(false),
            read_only_root_filesystem: Some(true),
            capabilities: Some(Capabilities {
                drop: Some(vec!["ALL".to_owned()]),
                add: Some(vec!["SYS_PTRACE".to_owned()]),
            }),
            ..SecurityContext::default()
        }),
        volume_mounts: Some(vec![
            VolumeMount {
                name: output_files::VOLUME.to_owned(),
                mount_path: HELPER_DIR.to_owned(),
                read_only: Some(false),
                ..VolumeMount::default()
            },
            VolumeMount {
                name: DATA_VOLUME.to_owned(),
                mount_path: TRACE_MOUNT.to_owned(),
                sub_path: Some(sub_path),
                read_only: Some(false),
                ..VolumeMount::default()
            },
        ]),
        ..Container::default()
    }
}

/// Renders the tracing of a traced job; nothing for another.
pub fn build(cx: &Context<'_>, draft: &mut Draft) -> Result<(), PipelineError> {
    let Some(why) = why(cx) else {
        return Ok(());
    };
    let config = &cx.pipeline().traced;
    check_config(config)?;
    let (folder, sub_path) = place(cx)?;
    let busybox = format!("{HELPER_DIR}/busybox");
    gate(draft, &busybox, config.attach_seconds, field(cx))?;
    output_files::ensure_busybox(cx, draft);
    if config.folder.is_empty() {
        // Over the read-write output folder: the job sees its trace and cannot change it.
        draft.mount(VolumeMount {
            name: DATA_VOLUME.to_owned(),
            mount_path: format!("{WORK}/{SUBFOLDER}"),
            sub_path: Some(sub_path.clone()),
            read_only: Some(true),
            ..VolumeMount::default()
        });
    }
    let has_data = draft
        .pod
        .volumes
        .iter()
        .flatten()
        .any(|v| v.name == DATA_VOLUME);
    if !has_data {
        draft.add_volume(Volume {
            name: DATA_VOLUME.to_owned(),
            persistent_volume_claim: Some(PersistentVolumeClaimVolumeSource {
                claim_name: cx.pipeline().storage.claim_name.clone(),
                read_only: Some(false),
            }),
            ..Volume::default()
        });
    }
    draft.sidecars.push(tracer(config, &busybox, sub_path));
    draft.pod.share_process_namespace = Some(true);
    let prefix = &cx.keys.prefix;
    draft.annotate(&format!("{prefix}{TRACED_ANNOTATION}"), why);
    KEPT.annotate(draft, prefix, folder, config.max_bytes);
    Ok(())
}

/// Whether a container command is the tracer's (for the simulator).
pub fn is_tracer(command: &[String]) -> bool {
    matches!(command, [_, sh, c, script, name, ..] if sh == "sh" && c == "-c" && script == TRACER && name == TRACER_NAME)
}

/// The application's argv behind the gate; `None` for any other command.
pub fn ungate(command: &[String]) -> Option<&[String]> {
    match command {
        [_, sh, c, script, name, _, _, argv @ ..]
            if sh == "sh" && c == "-c" && script == GATE && name == GATE_NAME =>
        {
            Some(argv)
        }
        _ => None,
    }
}

/// Why a job is traced, from its annotations; `None` when it is not.
pub fn reason(annotations: Option<&BTreeMap<String, String>>, prefix: &str) -> Option<String> {
    annotations?
        .get(&format!("{prefix}{TRACED_ANNOTATION}"))
        .cloned()
}

/// Where a traced job's trace is, from its annotations: the folder and every rank's file, as storage
/// paths. `None` when the job is not traced.
pub fn location(
    annotations: Option<&BTreeMap<String, String>>,
    prefix: &str,
    replicas: u32,
) -> Option<KeptTrace> {
    KEPT.location(annotations, prefix, replicas).map(Into::into)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_gate_and_the_tracer_come_apart_again() {
        let mut command: Vec<String> = ["/b", "sh", "-c", GATE, GATE_NAME, "/b", "100", "python"]
            .map(String::from)
            .to_vec();
        assert_eq!(ungate(&command), Some(&["python".to_owned()][..]));
        command[3] = "echo".into();
        assert_eq!(ungate(&command), None);
        let tracer: Vec<String> = [
            "/b",
            "sh",
            "-c",
            TRACER,
            TRACER_NAME,
            "/b",
            "/usr/bin/strace",
        ]
        .map(String::from)
        .to_vec();
        assert!(is_tracer(&tracer));
        assert!(!is_tracer(&tracer[..3]));
    }

    #[test]
    fn the_tracer_cuts_with_the_marker_of_the_traces() {
        assert!(TRACER.contains(&KEPT.printed_marker()));
    }

    #[test]
    fn the_scripts_are_posix_and_survive_kubernetes_expansion() {
        for script in [GATE, TRACER] {
            for bashism in ["[[", "function ", "$'", "local ", "pipefail", "<(", "&>"] {
                assert!(!script.contains(bashism), "{bashism}");
            }
            for expanded in ["$(", "$$"] {
                assert!(!script.contains(expanded), "{expanded}");
            }
        }
    }

    #[test]
    fn the_location_names_every_ranks_trace() {
        let annotations = BTreeMap::from([
            (
                "p/traceFolder".to_owned(),
                "/home/a/Jobs/1/trace".to_owned(),
            ),
            ("p/traceMaxBytes".to_owned(), "100".to_owned()),
        ]);
        let kept = location(Some(&annotations), "p/", 2).unwrap();
        assert_eq!(kept.folder, "/home/a/Jobs/1/trace");
        assert_eq!(
            kept.files,
            [
                "/home/a/Jobs/1/trace/trace-0.txt",
                "/home/a/Jobs/1/trace/trace-1.txt"
            ]
        );
        assert_eq!(kept.max_bytes, 100);
        assert!(location(Some(&BTreeMap::new()), "p/", 2).is_none());
    }

    /// The example traced submission rendered with `pipeline`.
    fn rendered(
        job: &crate::messages::v1::SubmitJob,
        pipeline: &crate::pipeline::PipelineConfig,
    ) -> Result<k8s_openapi::api::core::v1::PodSpec, PipelineError> {
        let licenses = BTreeMap::new();
        let settings = crate::pipeline::Settings {
            pipeline,
            licenses: &licenses,
        };
        let desired = crate::pipeline::render(job, settings, jiff::Timestamp::UNIX_EPOCH)?;
        Ok(desired.vcjob.spec.tasks[0].template.spec.clone().unwrap())
    }

    fn example() -> crate::messages::v1::SubmitJob {
        serde_json::from_str(include_str!(
            "../../../schemas/examples/submit-job.traced.json"
        ))
        .unwrap()
    }

    /// With the operator's folder, the trace goes to `<folder>/<jobId>`, which only the tracer mounts:
    /// the job's container has no mount of it, and a job without an output folder is traced too.
    #[test]
    fn the_operators_folder_is_mounted_by_the_tracer_alone() {
        let mut pipeline = crate::pipeline::PipelineConfig::default();
        pipeline.traced.folder = "/audit/traces/".into();
        let mut job = example();
        job.output_folder = None;
        let pod = rendered(&job, &pipeline).unwrap();
        let user = &pod.containers[0];
        let tracer = &pod.containers[1];
        assert_eq!(tracer.name, TRACER_CONTAINER);
        assert!(
            user.volume_mounts
                .iter()
                .flatten()
                .all(|m| m.name != DATA_VOLUME),
            "{:?}",
            user.volume_mounts
        );
        let trace = &tracer.volume_mounts.as_ref().unwrap()[1];
        assert_eq!(trace.sub_path.as_deref(), Some("audit/traces/4821"));
        assert_eq!(trace.read_only, Some(false));
        assert_eq!(
            pod.volumes
                .iter()
                .flatten()
                .filter(|v| v.name == DATA_VOLUME)
                .count(),
            1
        );
        assert_eq!(pod.share_process_namespace, Some(true));
    }

    /// The operator traces every job of a product (by category) or project, whatever the submission
    /// says; other jobs are not traced.
    #[test]
    fn the_operator_traces_listed_products_and_projects() {
        let mut job = example();
        job.traced = false;
        let mut pipeline = crate::pipeline::PipelineConfig::default();
        assert_eq!(rendered(&job, &pipeline).unwrap().containers.len(), 1);
        pipeline.traced.products = vec!["u1-standard".into()];
        assert_eq!(rendered(&job, &pipeline).unwrap().containers.len(), 2);
        pipeline.traced.products.clear();
        pipeline.traced.projects = vec!["registry-study".into()];
        assert_eq!(rendered(&job, &pipeline).unwrap().containers.len(), 2);
        job.output_folder = None;
        let refused = rendered(&job, &pipeline).unwrap_err().to_string();
        assert!(
            refused.starts_with("traced (by [pipeline.traced]): "),
            "{refused}"
        );
    }

    #[test]
    fn an_application_without_a_command_is_refused_naming_traced() {
        let mut job = example();
        job.application.as_mut().unwrap().invocation.clear();
        let refused = rendered(&job, &crate::pipeline::PipelineConfig::default())
            .unwrap_err()
            .to_string();
        assert!(
            refused.starts_with("traced: the application has no command"),
            "{refused}"
        );
    }

    /// The gate and the tracer run for real, as in the pod: Debian's static busybox runs both scripts,
    /// Debian's strace traces, and the job runs in a mount namespace of its own where the trace folder
    /// is a read-only bind mount over its read-write output folder, as the pod's `/work/trace` is.
    mod real {
        use super::*;
        use std::io::Read;
        use std::net::TcpListener;
        use std::path::{Path, PathBuf};
        use std::process::{Child, Command, ExitStatus, Stdio};
        use std::sync::atomic::{AtomicU32, Ordering};
        use std::time::{Duration, Instant};

        const BUSYBOX: &str = "/usr/bin/busybox";
        const STRACE: &str = "/usr/bin/strace";

        struct Pod {
            dir: PathBuf,
        }

        impl Pod {
            fn new() -> Self {
                static N: AtomicU32 = AtomicU32::new(0);
                let dir = std::env::temp_dir().join(format!(
                    "vr-traced-{}-{}",
                    std::process::id(),
                    N.fetch_add(1, Ordering::SeqCst)
                ));
                let _ = std::fs::remove_dir_all(&dir);
                std::fs::create_dir_all(dir.join("helper")).unwrap();
                std::fs::create_dir_all(dir.join("work/trace")).unwrap();
                std::os::unix::fs::symlink(BUSYBOX, dir.join("helper/busybox"))
                    .expect("busybox-static is installed (scripts/test installs it)");
                assert!(
                    Path::new(STRACE).exists(),
                    "strace is installed (scripts/test installs it)"
                );
                std::fs::write(dir.join("work/input.txt"), "staged data\n").unwrap();
                Self { dir }
            }

            fn busybox(&self) -> PathBuf {
                self.dir.join("helper/busybox")
            }

            fn work(&self) -> PathBuf {
                self.dir.join("work")
            }

            fn trace_dir(&self) -> PathBuf {
                self.dir.join("work/trace")
            }

            /// The tracer container's command, with `max` bytes per rank.
            fn tracer(&self, max: u64) -> Child {
                Command::new(self.busybox())
                    .args(["sh", "-c", TRACER, TRACER_NAME])
                    .arg(self.busybox())
                    .arg(STRACE)
                    .arg(self.trace_dir())
                    .arg(max.to_string())
                    .arg("256")
                    .arg("200")
                    .arg(CALLS)
                    .env("VC_TASK_INDEX", "0")
                    .stdin(Stdio::null())
                    .stdout(Stdio::null())
                    .stderr(Stdio::null())
                    .spawn()
                    .unwrap()
            }

            /// The user's container: the gate in front of `script` (run by busybox sh), in a mount
            /// namespace where the trace folder is read-only.
            fn job(&self, script: &str) -> Child {
                let trace = self.trace_dir();
                let protect = "mount --bind \"$1\" \"$1\" && mount -o remount,bind,ro \"$1\" && shift && exec \"$@\"";
                Command::new("unshare")
                    .args(["-m", "--propagation", "private"])
                    .arg(self.busybox())
                    .args(["sh", "-c", protect, "protect"])
                    .arg(&trace)
                    .arg(self.busybox())
                    .args(["sh", "-c", GATE, GATE_NAME])
                    .arg(self.busybox())
                    .arg("200")
                    .args([BUSYBOX, "sh", "-c", script, "app"])
                    .env("W", self.work())
                    .env("T", &trace)
                    .stdin(Stdio::null())
                    .stdout(Stdio::piped())
                    .stderr(Stdio::piped())
                    .spawn()
                    .expect("unshare (util-linux) runs")
            }

            fn trace(&self) -> String {
                std::fs::read_to_string(self.trace_dir().join(file_name(0))).unwrap_or_default()
            }

            /// Waits until the trace holds `needle`.
            fn wait_for(&self, needle: &str) {
                self.wait_until(needle, |trace| trace.contains(needle));
            }

            /// Waits until the trace is `what` (`done` says when).
            fn wait_until(&self, what: &str, done: impl Fn(&str) -> bool) {
                let deadline = Instant::now() + Duration::from_secs(30);
                while !done(&self.trace()) {
                    assert!(
                        Instant::now() < deadline,
                        "the trace never showed {what}:\n{}",
                        self.trace()
                    );
                    std::thread::sleep(Duration::from_millis(20));
                }
            }
        }

        impl Drop for Pod {
            fn drop(&mut self) {
                let _ = std::fs::remove_dir_all(&self.dir);
            }
        }

        fn wait(child: &mut Child, what: &str) -> ExitStatus {
            let deadline = Instant::now() + Duration::from_secs(30);
            loop {
                if let Some(status) = child.try_wait().unwrap() {
                    return status;
                }
                if Instant::now() > deadline {
                    let _ = child.kill();
                    panic!("{what} did not end");
                }
                std::thread::sleep(Duration::from_millis(20));
            }
        }

        fn signal(child: &Child, sig: &str) {
            let status = Command::new("kill")
                .args([sig, &child.id().to_string()])
                .status()
                .unwrap();
            assert!(status.success(), "kill {sig}");
        }

        /// Whether the process ignores SIGTERM (its `SigIgn` mask in `/proc`).
        fn ignores_sigterm(child: &Child) -> bool {
            let status = std::fs::read_to_string(format!("/proc/{}/status", child.id())).unwrap();
            status
                .lines()
                .find_map(|l| l.strip_prefix("SigIgn:"))
                .and_then(|mask| u64::from_str_radix(mask.trim(), 16).ok())
                .is_some_and(|mask| mask & (1 << (15 - 1)) != 0)
        }

        fn stderr(child: &mut Child) -> String {
            let mut s = String::new();
            if let Some(mut e) = child.stderr.take() {
                let _ = e.read_to_string(&mut s);
            }
            s
        }

        /// A listener that accepts (and closes) connections, and its port.
        fn listener() -> u16 {
            let l = TcpListener::bind("127.0.0.1:0").unwrap();
            let port = l.local_addr().unwrap().port();
            std::thread::spawn(move || {
                for c in l.incoming() {
                    drop(c);
                }
            });
            port
        }

        /// What the work does in every test: it opens a staged file, connects to a listener and forks.
        fn work(port: u16) -> String {
            format!(
                "read -r line < \"$W/input.txt\"; echo \"read: $line\"; \
                 echo hi | /usr/bin/busybox nc 127.0.0.1 {port}; \
                 (/usr/bin/busybox true); /usr/bin/busybox cat \"$W/input.txt\" >/dev/null"
            )
        }

        fn assert_names_the_work(trace: &str, pod: &Pod, port: u16) {
            let input = pod.work().join("input.txt").display().to_string();
            assert!(
                trace.contains(&format!("openat(AT_FDCWD, \"{input}\", O_RDONLY")),
                "the open of the staged file:\n{trace}"
            );
            assert!(
                trace.contains(&format!(
                    "sin_port=htons({port}), sin_addr=inet_addr(\"127.0.0.1\")"
                )),
                "the connect:\n{trace}"
            );
            assert!(
                trace.contains("connect(") && trace.contains(") = 0"),
                "{trace}"
            );
            assert!(
                ["clone(", "fork(", "vfork("]
                    .iter()
                    .any(|f| trace.contains(f)),
                "a fork:\n{trace}"
            );
            assert!(
                trace.contains("execve(\"/usr/bin/busybox\", [\"/usr/bin/busybox\", \"cat\""),
                "the forked child's exec, with its arguments:\n{trace}"
            );
            // Each line starts with the pid of its process: the children are followed.
            let pids: std::collections::BTreeSet<&str> = trace
                .lines()
                .filter_map(|l| l.split_whitespace().next())
                .filter(|p| p.chars().all(|c| c.is_ascii_digit()))
                .collect();
            assert!(pids.len() >= 3, "children are followed: {pids:?}\n{trace}");
        }

        #[test]
        fn a_traced_job_that_opens_connects_and_forks_leaves_a_trace_naming_those_calls() {
            let pod = Pod::new();
            let port = listener();
            let mut tracer = pod.tracer(1 << 20);
            let mut job = pod.job(&format!("{}; exit 3", work(port)));
            let status = wait(&mut job, "the job");
            let err = stderr(&mut job);
            assert_eq!(status.code(), Some(3), "the application's exit code: {err}");
            assert!(
                wait(&mut tracer, "the tracer").success(),
                "the tracer ends with the job"
            );
            let trace = pod.trace();
            assert_names_the_work(&trace, &pod, port);
            // The application itself was started traced: its exec is in the trace.
            assert!(
                trace
                    .contains("execve(\"/usr/bin/busybox\", [\"/usr/bin/busybox\", \"sh\", \"-c\""),
                "{trace}"
            );
            assert!(
                trace.trim_end().ends_with("+++ exited with 3 +++"),
                "{trace}"
            );
            // Nothing of the handshake is left.
            assert!(!pod.dir.join("helper/trace-pid").exists());
        }

        #[test]
        fn the_job_cannot_modify_its_trace() {
            let pod = Pod::new();
            let port = listener();
            let mut tracer = pod.tracer(1 << 20);
            let script = format!(
                "{}; echo forged >> \"$T/trace-0.txt\"; echo forged > \"$T/trace-0.txt\"; \
                 rm -f \"$T/trace-0.txt\"; mv \"$T\" \"$W/moved\"; echo forged > \"$T/other.txt\"; \
                 chmod 777 \"$T/trace-0.txt\"; rm -rf \"$T\"; echo forged >> \"$W/mine.txt\"",
                work(port)
            );
            let mut job = pod.job(&script);
            assert!(wait(&mut job, "the job").success(), "{}", stderr(&mut job));
            assert!(wait(&mut tracer, "the tracer").success());
            let trace = pod.trace();
            assert_names_the_work(&trace, &pod, port);
            assert!(!trace.lines().any(|l| l == "forged"), "{trace}");
            // The job's own folder stays writable; its trace folder is not, and every attempt is traced.
            assert_eq!(
                std::fs::read_to_string(pod.work().join("mine.txt")).unwrap(),
                "forged\n"
            );
            assert!(!pod.trace_dir().join("other.txt").exists());
            assert!(!pod.work().join("moved").exists());
            let path = pod.trace_dir().join("trace-0.txt").display().to_string();
            assert!(
                trace.contains(&format!("\"{path}\", O_WRONLY|O_CREAT|O_APPEND")),
                "{trace}"
            );
            assert!(trace.contains("EROFS"), "{trace}");
            assert!(
                trace
                    .lines()
                    .any(|l| l.contains("unlink") && l.contains(&path) && l.contains("EROFS")),
                "{trace}"
            );
            assert!(trace.contains("rename"), "{trace}");
            use std::os::unix::fs::PermissionsExt;
            let mode = std::fs::metadata(&path).unwrap().permissions().mode();
            assert_ne!(mode & 0o777, 0o777, "chmod did not apply");
        }

        /// A cancel: the pod's containers get SIGTERM; the application ends on it, and the tracer,
        /// which ignores it, records the application's last calls and its end, then ends.
        #[test]
        fn the_trace_is_complete_after_a_cancel() {
            let pod = Pod::new();
            let port = listener();
            let mut tracer = pod.tracer(1 << 20);
            let script = format!(
                "trap 'cat \"$W/input.txt\" > \"$W/last-words.txt\"; exit 143' TERM; {}; \
                 echo ready; while :; do /usr/bin/busybox sleep 0.05; done",
                work(port)
            );
            let mut job = pod.job(&script);
            // The loop's sleep is exec'd (as the script's own text, traced with its exec, names `nc`
            // and `sleep` before the trap is set): the trap is set.
            pod.wait_for(r#"["/usr/bin/busybox", "sleep", "0.05"]"#);
            signal(&tracer, "-TERM");
            signal(&job, "-TERM");
            assert_eq!(wait(&mut job, "the job").code(), Some(143));
            assert!(wait(&mut tracer, "the tracer").success());
            let trace = pod.trace();
            assert_names_the_work(&trace, &pod, port);
            assert!(
                trace.contains("--- SIGTERM"),
                "the cancel's signal:\n{trace}"
            );
            let last = pod.work().join("last-words.txt").display().to_string();
            assert!(
                trace.contains(&format!("\"{last}\", O_WRONLY|O_CREAT|O_TRUNC")),
                "what it did on SIGTERM:\n{trace}"
            );
            assert!(
                trace.trim_end().ends_with("+++ exited with 143 +++"),
                "{trace}"
            );
        }

        /// An expiry of a job that ignores SIGTERM: at the end of the grace period every process of the
        /// pod is killed. Every call the job made up to then is in the trace: each of its writes to
        /// `count.txt` was preceded by an open the trace holds.
        ///
        /// Each step waits for what the trace shows, not for time: the signals go once the loop's opens
        /// are traced (the script's own text names `count.txt` too, and its exec is traced before it has
        /// set its trap: a SIGTERM then ended the job, and the tracer with it, on a loaded machine), and
        /// the tracer is seen to outlive its SIGTERM by the job's calls traced after that signal.
        #[test]
        fn the_trace_is_complete_after_an_expiry_that_kills() {
            let pod = Pod::new();
            let port = listener();
            let mut tracer = pod.tracer(1 << 20);
            let script = format!(
                "trap '' TERM; {}; i=0; while :; do i=$((i+1)); echo $i >> \"$W/count.txt\"; done",
                work(port)
            );
            let mut job = pod.job(&script);
            let count = pod.work().join("count.txt").display().to_string();
            let open = format!("openat(AT_FDCWD, \"{count}\"");
            // The loop runs, so the trap before it is set.
            pod.wait_for(&open);
            signal(&tracer, "-TERM");
            signal(&job, "-TERM");
            // The tracer ignores SIGTERM (the signal is dropped, not pending), so only the end of the
            // traced processes ends it.
            assert!(
                ignores_sigterm(&tracer),
                "the tracer ignores SIGTERM (SigIgn of its shell)"
            );
            // The job got its SIGTERM (traced, since it is traced), and went on being traced: a dozen
            // rounds of its loop after it (waited for, not assumed: a loaded machine runs few in a
            // fixed time).
            pod.wait_until("the job's calls traced after its SIGTERM", |trace| {
                trace
                    .split_once("--- SIGTERM")
                    .is_some_and(|(_, after)| after.matches(open.as_str()).count() > 11)
            });
            assert!(
                tracer.try_wait().unwrap().is_none(),
                "the tracer outlives the SIGTERM"
            );
            // The grace period is over: the kubelet kills the pod's processes.
            signal(&job, "-KILL");
            assert!(wait(&mut job, "the job").code().is_none());
            signal(&tracer, "-KILL");
            let _ = wait(&mut tracer, "the tracer");
            let trace = pod.trace();
            assert_names_the_work(&trace, &pod, port);
            let written = std::fs::read_to_string(&count).unwrap().lines().count();
            let opened = trace
                .lines()
                .filter(|l| l.contains(&open) && l.contains(") = "))
                .count();
            assert!(written > 10, "the job ran a while ({written} writes)");
            assert!(
                opened >= written,
                "{written} lines written, {opened} opens traced:\n{}",
                &trace[trace.len().saturating_sub(2000)..]
            );
        }

        #[test]
        fn a_trace_past_the_bound_is_cut_with_the_marker_and_the_job_is_not_slowed_to_a_halt() {
            let pod = Pod::new();
            let mut tracer = pod.tracer(4096);
            let mut job = pod.job(
                "i=0; while [ $i -lt 300 ]; do /usr/bin/busybox cat \"$W/input.txt\" >/dev/null; i=$((i+1)); done; exit 5",
            );
            assert_eq!(wait(&mut job, "the job").code(), Some(5));
            assert!(wait(&mut tracer, "the tracer").success());
            let trace = pod.trace();
            let marker = format!("\n{}\n", KEPT.cut_marker(4096));
            assert!(
                trace.ends_with(&marker),
                "{}",
                &trace[trace.len().saturating_sub(300)..]
            );
            assert_eq!(trace.len(), 4096 + marker.len());
        }

        #[test]
        fn without_a_tracer_the_job_does_not_run() {
            let pod = Pod::new();
            let started = pod.work().join("started");
            let mut job = Command::new(pod.busybox())
                .args(["sh", "-c", GATE, GATE_NAME])
                .arg(pod.busybox())
                .arg("5")
                .args(["/usr/bin/busybox", "touch"])
                .arg(&started)
                .stderr(Stdio::piped())
                .spawn()
                .unwrap();
            assert_eq!(wait(&mut job, "the gate").code(), Some(126));
            assert!(stderr(&mut job).contains("does not run untraced"));
            assert!(!started.exists());
        }
    }
}
