//! NetworkLimit: the `kubernetes.io/ingress-bandwidth` and `kubernetes.io/egress-bandwidth` pod
//! annotations from the configuration (UCloud left them commented out, so the plugin did nothing). They
//! take effect with a CNI that has the bandwidth plugin.

use super::{Plugin, PluginId};
use crate::pipeline::context::Context;
use crate::pipeline::draft::Draft;
use crate::pipeline::{PipelineError, names};

/// Pod annotation read by the CNI bandwidth plugin.
pub const INGRESS_ANNOTATION: &str = "kubernetes.io/ingress-bandwidth";
/// Pod annotation read by the CNI bandwidth plugin.
pub const EGRESS_ANNOTATION: &str = "kubernetes.io/egress-bandwidth";

/// The NetworkLimit plugin; the module documentation says what it builds and why.
pub struct NetworkLimit;

impl Plugin for NetworkLimit {
    fn id(&self) -> PluginId {
        PluginId::NetworkLimit
    }

    fn build(&self, cx: &Context<'_>, draft: &mut Draft) -> Result<(), PipelineError> {
        let config = &cx.pipeline().network_limit;
        for (annotation, key, value) in [
            (
                INGRESS_ANNOTATION,
                "network_limit.ingress_bandwidth",
                &config.ingress_bandwidth,
            ),
            (
                EGRESS_ANNOTATION,
                "network_limit.egress_bandwidth",
                &config.egress_bandwidth,
            ),
        ] {
            if let Some(value) = value {
                if !names::is_quantity(value) {
                    return Err(PipelineError::config(
                        key,
                        format!("`{value}` is not a quantity"),
                    ));
                }
                draft.annotate_pods(annotation, value.clone());
            }
        }
        Ok(())
    }
}
