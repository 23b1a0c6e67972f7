//! Miscellaneous: pod hygiene. `restartPolicy: Never` (Volcano's policies decide what happens to a failed
//! pod), no service account token and no service links (a job has no business with the Kubernetes API
//! or other services' environment variables), seccomp `RuntimeDefault`, and for the user's container:
//! `workingDir: /work` unless the application turns it off, `runAsNonRoot`, no privilege escalation and
//! all capabilities dropped unless the application must run as root. A root application gets the
//! container runtime's default capabilities (what `apt-get`, `chown`, `su` and `sudo` need) and keeps
//! seccomp `RuntimeDefault`; isolating it further is the operator's choice of runtime, Kata by product
//! (`[pipeline.kata] products`, the KataContainer plugin).

use k8s_openapi::api::core::v1::{
    Capabilities, PodSecurityContext, SeccompProfile, SecurityContext,
};

use super::{Plugin, PluginId};
use crate::pipeline::PipelineError;
use crate::pipeline::context::Context;
use crate::pipeline::draft::Draft;
use crate::pipeline::mounts::WORK;

/// The Miscellaneous plugin; the module documentation says what it builds and why.
pub struct Miscellaneous;

impl Plugin for Miscellaneous {
    fn id(&self) -> PluginId {
        PluginId::Miscellaneous
    }

    fn build(&self, cx: &Context<'_>, draft: &mut Draft) -> Result<(), PipelineError> {
        let container = cx.app.container.as_ref();
        let change_dir = container
            .and_then(|c| c.change_working_directory)
            .unwrap_or(true);
        let root = container.and_then(|c| c.run_as_root).unwrap_or(false);

        let pod = &mut draft.pod;
        pod.restart_policy = Some("Never".to_owned());
        pod.automount_service_account_token = Some(false);
        pod.enable_service_links = Some(false);
        pod.security_context = Some(PodSecurityContext {
            seccomp_profile: Some(SeccompProfile {
                type_: "RuntimeDefault".to_owned(),
                localhost_profile: None,
            }),
            ..PodSecurityContext::default()
        });

        if change_dir {
            draft.user.working_dir = Some(WORK.to_owned());
        }
        draft.user.security_context = Some(SecurityContext {
            run_as_non_root: Some(!root),
            allow_privilege_escalation: Some(root),
            // Root keeps the runtime's default set: without CHOWN, DAC_OVERRIDE, FOWNER, SETUID,
            // SETGID and the rest, `apt-get`, `chown`, `su` and `sudo` fail, and they are what a root
            // application exists for.
            capabilities: (!root).then(|| Capabilities {
                drop: Some(vec!["ALL".to_owned()]),
                add: None,
            }),
            ..SecurityContext::default()
        });
        Ok(())
    }
}
