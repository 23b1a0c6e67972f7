//! What every plugin reads while rendering one job: the submission's required parts, resolved once, the
//! names and placement, and the derived collections (files, peers, public links and IPs) in UCloud's
//! order (resources first, then parameters).

use prost::Message;

pub use super::located::{Located, Origin};
use super::mounts::{self, MountPlan};
use super::names::{self, OwnerKind};
use super::{NamespaceMode, PipelineConfig, PipelineError};
use crate::durable::annotations::AnnotationKeys;
use crate::messages::v1::{
    Application, FileValue, IngressValue, NetworkIpValue, Owner, PeerValue, Product, SubmitJob,
    parameter_value, resource_value,
};

/// Namespace and queue of the job.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Placement {
    /// The namespace the job and its companions live in.
    pub namespace: String,
    /// Whether that namespace is the owner's own (declared and created on demand).
    pub per_owner: bool,
    /// The Volcano queue.
    pub queue: String,
    /// Whether the queue is the project's own (declared and created on demand).
    pub project_queue: bool,
    /// Whether the queue is `[pipeline.scheduling] interactive_queue` (declared and created on demand,
    /// `fifo`, so that a deployment without it still runs interactive jobs and the monitor, which
    /// watches the Queues, knows its order).
    pub interactive_queue: bool,
}

/// The resolved input of one render.
pub struct Context<'a> {
    /// The submission.
    pub job: &'a SubmitJob,
    /// `[pipeline]` and the license servers.
    pub settings: super::Settings<'a>,
    /// The application (required).
    pub app: &'a Application,
    /// The product (required).
    pub product: &'a Product,
    /// The owner (required).
    pub owner: &'a Owner,
    /// The annotation keys under the configured prefix.
    pub keys: std::borrow::Cow<'a, AnnotationKeys>,
    /// When the render happens; only recorded.
    pub now: jiff::Timestamp,
    /// The job id, checked to make valid object, pod and host names.
    pub job_id: &'a str,
    /// `j-<jobId>`.
    pub vcjob_name: String,
    /// Number of ranks, at least 1.
    pub replicas: u32,
    /// Namespace and queue (FairShare's decision).
    pub placement: Placement,
    /// Where every file and folder is mounted; Parameter and FileMount both read it, so the argument a
    /// program receives is always its mount point.
    pub mounts: MountPlan,
    /// Every file value: resources first, then parameters by name.
    pub files: Vec<Located<'a, FileValue>>,
    /// Every peer value, in the same order.
    pub peers: Vec<Located<'a, PeerValue>>,
    /// Every public link, in the same order.
    pub ingresses: Vec<Located<'a, IngressValue>>,
    /// Every public IP, in the same order.
    pub network_ips: Vec<Located<'a, NetworkIpValue>>,
}

impl<'a> Context<'a> {
    /// Resolves the required parts of `job`; refuses a job without them, naming the field.
    pub fn new(
        job: &'a SubmitJob,
        settings: super::Settings<'a>,
        now: jiff::Timestamp,
    ) -> Result<Self, PipelineError> {
        let pipeline = settings.pipeline;
        let app = job
            .application
            .as_ref()
            .ok_or_else(|| PipelineError::invalid("application", "is required"))?;
        let product = job
            .product
            .as_ref()
            .ok_or_else(|| PipelineError::invalid("product", "is required"))?;
        let owner = job
            .owner
            .as_ref()
            .ok_or_else(|| PipelineError::invalid("owner", "is required"))?;
        if owner.user.is_empty() {
            return Err(PipelineError::invalid("owner.user", "must not be empty"));
        }
        if job.replicas == 0 {
            return Err(PipelineError::invalid("replicas", "must be at least 1"));
        }
        if i32::try_from(job.replicas).is_err() {
            return Err(PipelineError::invalid("replicas", "is too large"));
        }
        check_job_id(&job.job_id, job.replicas)?;

        let (mut files, mut peers, mut ingresses, mut network_ips) =
            (Vec::new(), Vec::new(), Vec::new(), Vec::new());
        for (i, resource) in job.resources.iter().enumerate() {
            let origin = Origin::Resource(i);
            match &resource.value {
                Some(resource_value::Value::File(value)) => files.push(Located { origin, value }),
                Some(resource_value::Value::Peer(value)) => peers.push(Located { origin, value }),
                Some(resource_value::Value::Ingress(value)) => {
                    ingresses.push(Located { origin, value })
                }
                Some(resource_value::Value::NetworkIp(value)) => {
                    network_ips.push(Located { origin, value })
                }
                None => {
                    return Err(PipelineError::invalid(
                        format!("resources[{i}]"),
                        "has no value",
                    ));
                }
            }
        }
        for (name, parameter) in &job.parameters {
            let origin = Origin::Parameter(name);
            match &parameter.value {
                Some(parameter_value::Value::File(value)) => files.push(Located { origin, value }),
                Some(parameter_value::Value::Peer(value)) => peers.push(Located { origin, value }),
                Some(parameter_value::Value::Ingress(value)) => {
                    ingresses.push(Located { origin, value })
                }
                Some(parameter_value::Value::NetworkIp(value)) => {
                    network_ips.push(Located { origin, value })
                }
                _ => {}
            }
        }

        let mounts = mounts::plan(&files, job.output_folder.as_deref(), &pipeline.storage)?;
        Ok(Self {
            job,
            settings,
            app,
            product,
            owner,
            keys: pipeline.keys(),
            now,
            job_id: &job.job_id,
            vcjob_name: names::vcjob_name(&job.job_id),
            replicas: job.replicas,
            // A booked job waits, gated, for its start: at the head of a fifo queue it would hold
            // every session behind it until then. It goes where the others go.
            placement: placement(
                owner,
                pipeline,
                interactive(app) && job.start_window.is_none(),
            ),
            mounts,
            files,
            peers,
            ingresses,
            network_ips,
        })
    }

    /// The `[pipeline]` section.
    pub fn pipeline(&self) -> &'a PipelineConfig {
        self.settings.pipeline
    }

    /// Replicas as the i32 Kubernetes fields take (checked in [`Context::new`]).
    pub fn replicas_i32(&self) -> i32 {
        i32::try_from(self.replicas).unwrap_or(i32::MAX)
    }
}

/// The job id must make a valid VolcanoJob name and, with the highest rank, a pod name and hostname of
/// at most 63 characters (Volcano names pods `<job>-<task>-<index>`).
fn check_job_id(job_id: &str, replicas: u32) -> Result<(), PipelineError> {
    if !names::is_dns1123_label(job_id) {
        return Err(PipelineError::invalid(
            "jobId",
            "must be lowercase letters, digits and '-', starting and ending with a letter or digit",
        ));
    }
    let longest = names::pod_name(job_id, replicas - 1);
    if longest.len() > 63 {
        return Err(PipelineError::invalid(
            "jobId",
            format!("is too long: pod name `{longest}` would exceed 63 characters"),
        ));
    }
    Ok(())
}

/// Whether the application is used interactively (web, VNC, terminal): its user waits at the screen
/// for it, so it goes to `[pipeline.scheduling] interactive_queue` when that is set.
pub fn interactive(app: &crate::messages::v1::Application) -> bool {
    use crate::messages::v1::ApplicationType;
    matches!(
        ApplicationType::try_from(app.application_type),
        Ok(ApplicationType::Web | ApplicationType::Vnc | ApplicationType::Terminal)
    )
}

/// FairShare's placement: the owner's namespace in per-owner mode, the project's queue when per-project
/// queues are on, the interactive queue for an interactive job when there is one. With the FairShare
/// plugin off, every job goes to `namespace.name` and the default queue (or the interactive one).
fn placement(owner: &Owner, pipeline: &PipelineConfig, interactive: bool) -> Placement {
    let fair_share = pipeline.plugins.fair_share;
    let per_owner = fair_share && pipeline.namespace.mode == NamespaceMode::PerOwner;
    let namespace = if per_owner {
        names::owner_namespace(&pipeline.namespace.prefix, owner)
    } else {
        pipeline.namespace.name.clone()
    };
    let project = owner.project.as_deref().filter(|p| !p.is_empty());
    let interactive_queue = pipeline
        .scheduling
        .interactive_queue
        .clone()
        .filter(|_| interactive);
    let interactive = interactive_queue.is_some();
    let (queue, project_queue) = match project {
        _ if interactive => (interactive_queue.unwrap_or_default(), false),
        Some(project) if fair_share && pipeline.scheduling.queue_per_project => (
            names::owner_scoped_name(&pipeline.namespace.prefix, OwnerKind::Project, project),
            true,
        ),
        _ => (pipeline.scheduling.queue.clone(), false),
    };
    Placement {
        namespace,
        per_owner,
        queue,
        project_queue,
        interactive_queue: interactive,
    }
}

/// A stable fingerprint of a submission: `sha256:<hex>` of its protobuf encoding. prost encodes fields in
/// tag order and maps in key order, so the same message always gives the same bytes, whether it arrived
/// as JSON or protobuf. The runner compares it with the `submissionHash` annotation of an existing
/// VolcanoJob to tell a redelivery (same hash) from a reused job id (different hash).
pub fn fingerprint(job: &SubmitJob) -> String {
    let bytes = job.encode_to_vec();
    format!("sha256:{}", names::short_hash(&bytes, 64))
}
