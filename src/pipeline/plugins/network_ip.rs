//! NetworkIp (public IPs): an address can be attached to one pod only, so a job with public IPs and more
//! than one replica is refused, with UCloud's message. (Attaching the address itself is site-specific
//! and not done by the pipeline.)

use super::{Plugin, PluginId};
use crate::pipeline::PipelineError;
use crate::pipeline::context::Context;
use crate::pipeline::draft::Draft;

/// UCloud's message.
pub const MULTIPLE_REPLICAS: &str =
    "UCloud/compute does not currently support IPs with multiple nodes";

/// The NetworkIp plugin; the module documentation says what it builds and why.
pub struct NetworkIp;

impl Plugin for NetworkIp {
    fn id(&self) -> PluginId {
        PluginId::NetworkIp
    }

    fn build(&self, cx: &Context<'_>, _draft: &mut Draft) -> Result<(), PipelineError> {
        match cx.network_ips.first() {
            Some(first) if cx.replicas > 1 => Err(PipelineError::invalid(
                first.origin.field("networkIp"),
                MULTIPLE_REPLICAS,
            )),
            _ => Ok(()),
        }
    }
}
