//! Ingress (public links): the proxy routes one domain to one target, so a job with public links and more
//! than one replica is refused, with UCloud's message. The domains themselves reach the proxy through the
//! Proxy plugin.

use super::{Plugin, PluginId};
use crate::pipeline::context::Context;
use crate::pipeline::draft::Draft;
use crate::pipeline::{PipelineError, names};

/// UCloud's message.
pub const MULTIPLE_REPLICAS: &str =
    "UCloud/compute does not currently support ingress with multiple replicas";

/// The Ingress plugin; the module documentation says what it builds and why.
pub struct Ingress;

impl Plugin for Ingress {
    fn id(&self) -> PluginId {
        PluginId::Ingress
    }

    fn build(&self, cx: &Context<'_>, _draft: &mut Draft) -> Result<(), PipelineError> {
        if let Some(first) = cx.ingresses.first()
            && cx.replicas > 1
        {
            return Err(PipelineError::invalid(
                first.origin.field("ingress"),
                MULTIPLE_REPLICAS,
            ));
        }
        for ingress in &cx.ingresses {
            if !names::is_dns1123_subdomain(&ingress.value.domain) {
                return Err(PipelineError::invalid(
                    format!("{}.domain", ingress.origin.field("ingress")),
                    "must be a DNS name",
                ));
            }
        }
        Ok(())
    }
}
