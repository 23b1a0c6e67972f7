//! Minikube (development clusters, off by default): a LoadBalancer Service `j-<id>-mk` in front of the
//! job's web (or VNC) port, for clusters without the proxy. It is a companion, so it goes away with the
//! job.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{Service, ServicePort, ServiceSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;

use super::{Plugin, PluginId};
use crate::pipeline::PipelineError;
use crate::pipeline::context::Context;
use crate::pipeline::desired::Companion;
use crate::pipeline::draft::Draft;
use crate::volcano::LABEL_JOB_NAME;

/// `j-<jobId>-mk`.
pub fn service_name(job_id: &str) -> String {
    format!("j-{job_id}-mk")
}

/// The Minikube plugin; the module documentation says what it builds and why.
pub struct Minikube;

impl Plugin for Minikube {
    fn id(&self) -> PluginId {
        PluginId::Minikube
    }

    fn build(&self, cx: &Context<'_>, draft: &mut Draft) -> Result<(), PipelineError> {
        let (target, field) = match (cx.app.web_port, cx.app.vnc_port) {
            (Some(p), _) => (p, "application.webPort"),
            (None, Some(p)) => (p, "application.vncPort"),
            (None, None) => (80, "application.webPort"),
        };
        let target = i32::try_from(target)
            .ok()
            .filter(|p| (1..=65535).contains(p))
            .ok_or_else(|| PipelineError::invalid(field, "must be a port number"))?;
        draft.companions.push(Companion::Service(Box::new(Service {
            metadata: ObjectMeta {
                name: Some(service_name(cx.job_id)),
                ..ObjectMeta::default()
            },
            spec: Some(ServiceSpec {
                type_: Some("LoadBalancer".to_owned()),
                ports: Some(vec![ServicePort {
                    name: Some("placeholder".to_owned()),
                    port: 80,
                    target_port: Some(IntOrString::Int(target)),
                    protocol: Some("TCP".to_owned()),
                    ..ServicePort::default()
                }]),
                selector: Some(BTreeMap::from([(
                    LABEL_JOB_NAME.to_owned(),
                    cx.vcjob_name.clone(),
                )])),
                ..ServiceSpec::default()
            }),
            status: None,
        })));
        Ok(())
    }
}
