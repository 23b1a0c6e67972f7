//! [`Draft`]: the job under construction. The core builds the skeleton every plugin relies on (the one
//! task `job`, the container `user-job`, names, placement and the submission's essentials as
//! annotations); plugins then fill and append in registry order; [`Draft::finish`] assembles the
//! [`DesiredJob`]. Holding the pod spec and the user container as fields (not inside the task list)
//! means no plugin can find the structure missing.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{
    Capabilities, Container, EmptyDirVolumeSource, EnvVar, PodSpec, PodTemplateSpec,
    ResourceRequirements, SecurityContext, Volume, VolumeMount,
};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

use super::context::Context;
use super::desired::{Companion, DesiredJob, OwnerNamespace};
use super::names::{self, MANAGED_BY, MANAGED_BY_LABEL, TASK_NAME, USER_CONTAINER};
use crate::durable::annotations::format_millis;
use crate::volcano::{JobSpec, LifecyclePolicy, Queue, TaskSpec, VolcanoJob};

/// A job being rendered. Plugins change it through its public fields and helpers.
#[derive(Debug, Clone)]
pub struct Draft {
    /// Metadata of the VolcanoJob (name, namespace, labels, annotations).
    pub meta: ObjectMeta,
    /// Spec of the VolcanoJob, without its tasks.
    pub spec: JobSpec,
    /// Policies of the one task.
    pub task_policies: Vec<LifecyclePolicy>,
    /// Metadata of the pod template (labels and annotations every pod gets).
    pub pod_meta: ObjectMeta,
    /// The pod spec, without its containers.
    pub pod: PodSpec,
    /// The user's container, `user-job`.
    pub user: Container,
    /// Init containers, in order.
    pub init: Vec<Container>,
    /// Containers that run beside the user's (a traced job's tracer), after it in the pod.
    pub sidecars: Vec<Container>,
    /// The project's queue, when declared (FairShare).
    pub queue: Option<Queue>,
    /// The owner's namespace, when declared (FairShare).
    pub namespace: Option<OwnerNamespace>,
    /// Objects owned by the job.
    pub companions: Vec<Companion>,
}

impl Draft {
    /// The skeleton: names, placement, labels and the submission's essentials as annotations.
    pub fn new(cx: &Context<'_>) -> Self {
        let keys = &cx.keys;
        let product = cx.product;
        let mut annotations = BTreeMap::new();
        annotations.insert(keys.owner_user.clone(), cx.owner.user.clone());
        if let Some(project) = cx.owner.project.as_deref().filter(|p| !p.is_empty()) {
            annotations.insert(keys.owner_project.clone(), project.to_owned());
        }
        annotations.insert(keys.product_id.clone(), product.id.clone());
        annotations.insert(keys.product_category.clone(), product.category.clone());
        annotations.insert(keys.product_cpu.clone(), product.cpu.to_string());
        annotations.insert(
            keys.product_memory_gib.clone(),
            product.memory_gib.to_string(),
        );
        annotations.insert(keys.product_gpu.clone(), product.gpu.to_string());
        annotations.insert(keys.replicas.clone(), cx.replicas.to_string());
        annotations.insert(
            keys.application.clone(),
            format!("{}@{}", cx.app.name, cx.app.version),
        );
        annotations.insert(keys.submission_hash.clone(), super::fingerprint(cx.job));
        annotations.insert(keys.accepted_at.clone(), format_millis(cx.now));

        let labels = BTreeMap::from([(MANAGED_BY_LABEL.to_owned(), MANAGED_BY.to_owned())]);
        Self {
            meta: ObjectMeta {
                name: Some(cx.vcjob_name.clone()),
                namespace: Some(cx.placement.namespace.clone()),
                labels: Some(labels.clone()),
                annotations: Some(annotations),
                ..ObjectMeta::default()
            },
            spec: JobSpec::default(),
            task_policies: Vec::new(),
            pod_meta: ObjectMeta {
                // UCloud named the template `job-<jobId>`; Kubernetes ignores it, operators read it.
                name: Some(format!("{TASK_NAME}-{}", cx.job_id)),
                labels: Some(labels),
                ..ObjectMeta::default()
            },
            pod: PodSpec::default(),
            user: Container {
                name: USER_CONTAINER.to_owned(),
                ..Container::default()
            },
            init: Vec::new(),
            sidecars: Vec::new(),
            queue: None,
            namespace: None,
            companions: Vec::new(),
        }
    }

    /// Sets an annotation on the VolcanoJob.
    pub fn annotate(&mut self, key: &str, value: impl Into<String>) {
        self.meta
            .annotations
            .get_or_insert_with(BTreeMap::new)
            .insert(key.to_owned(), value.into());
    }

    /// Sets an annotation on every pod.
    pub fn annotate_pods(&mut self, key: &str, value: impl Into<String>) {
        self.pod_meta
            .annotations
            .get_or_insert_with(BTreeMap::new)
            .insert(key.to_owned(), value.into());
    }

    /// Sets a label on every pod.
    pub fn label_pods(&mut self, key: &str, value: impl Into<String>) {
        self.pod_meta
            .labels
            .get_or_insert_with(BTreeMap::new)
            .insert(key.to_owned(), value.into());
    }

    /// Appends a pod volume.
    pub fn add_volume(&mut self, volume: Volume) {
        self.pod.volumes.get_or_insert_with(Vec::new).push(volume);
    }

    /// Adds a helper init container that prepares a small scratch volume (an emptyDir of 16 MiB) the
    /// user's container then mounts at the same path: MultiNode's host file, the output wrapper's busybox.
    /// Locked down like every container the runner adds: non-root, no privilege escalation, read-only root
    /// file system, no capabilities, bounded CPU and memory.
    pub fn add_helper(&mut self, helper: Helper) {
        self.add_volume(Volume {
            name: helper.volume.to_owned(),
            empty_dir: Some(EmptyDirVolumeSource {
                size_limit: Some(Quantity("16Mi".to_owned())),
                ..EmptyDirVolumeSource::default()
            }),
            ..Volume::default()
        });
        let limits = BTreeMap::from([
            ("cpu".to_owned(), Quantity(helper.cpu)),
            ("memory".to_owned(), Quantity(helper.memory)),
        ]);
        let mount = VolumeMount {
            name: helper.volume.to_owned(),
            mount_path: helper.mount_path.to_owned(),
            read_only: Some(false),
            ..VolumeMount::default()
        };
        self.init.push(Container {
            name: helper.name.to_owned(),
            image: Some(helper.image),
            image_pull_policy: Some("IfNotPresent".to_owned()),
            command: Some(helper.command),
            env: helper.env,
            resources: Some(ResourceRequirements {
                limits: Some(limits.clone()),
                requests: Some(limits),
                claims: None,
            }),
            security_context: Some(SecurityContext {
                run_as_non_root: Some(true),
                run_as_user: Some(helper.run_as_user),
                allow_privilege_escalation: Some(false),
                read_only_root_filesystem: Some(true),
                capabilities: Some(Capabilities {
                    drop: Some(vec!["ALL".to_owned()]),
                    add: None,
                }),
                ..SecurityContext::default()
            }),
            volume_mounts: Some(vec![mount.clone()]),
            ..Container::default()
        });
        self.mount(mount);
    }

    /// Appends a mount to the user's container.
    pub fn mount(&mut self, mount: VolumeMount) {
        self.user
            .volume_mounts
            .get_or_insert_with(Vec::new)
            .push(mount);
    }

    /// The namespace the job lives in.
    pub fn job_namespace(&self) -> &str {
        self.meta.namespace.as_deref().unwrap_or_default()
    }

    /// Assembles the [`DesiredJob`].
    pub fn finish(self, cx: &Context<'_>) -> DesiredJob {
        let mut pod = self.pod;
        pod.containers = vec![self.user];
        pod.containers.extend(self.sidecars);
        if !self.init.is_empty() {
            pod.init_containers = Some(self.init);
        }
        let mut spec = self.spec;
        spec.tasks = vec![TaskSpec {
            name: TASK_NAME.to_owned(),
            replicas: cx.replicas_i32(),
            template: PodTemplateSpec {
                metadata: Some(self.pod_meta),
                spec: Some(pod),
            },
            policies: self.task_policies,
            ..TaskSpec::default()
        }];
        let mut companions = self.companions;
        let job_label = format!("{}job", cx.keys.prefix);
        for companion in &mut companions {
            let meta = companion.metadata_mut();
            meta.namespace = Some(cx.placement.namespace.clone());
            meta.labels
                .get_or_insert_with(BTreeMap::new)
                .insert(MANAGED_BY_LABEL.to_owned(), MANAGED_BY.to_owned());
            meta.labels
                .get_or_insert_with(BTreeMap::new)
                .insert(job_label.clone(), cx.vcjob_name.clone());
        }
        DesiredJob {
            queue: self.queue,
            namespace: self.namespace,
            vcjob: VolcanoJob {
                metadata: self.meta,
                spec,
                status: None,
            },
            companions,
        }
    }
}

/// Quick access used by several plugins.
pub(crate) fn job_selector(cx: &Context<'_>) -> BTreeMap<String, String> {
    BTreeMap::from([(
        crate::volcano::LABEL_JOB_NAME.to_owned(),
        names::vcjob_name(cx.job_id),
    )])
}

/// A helper init container for [`Draft::add_helper`].
pub struct Helper {
    pub name: &'static str,
    pub image: String,
    pub command: Vec<String>,
    pub env: Option<Vec<EnvVar>>,
    pub cpu: String,
    pub memory: String,
    pub run_as_user: i64,
    /// The scratch volume's name, and where both containers mount it.
    pub volume: &'static str,
    pub mount_path: &'static str,
}
