//! NetworkLimit: the `kubernetes.io/ingress-bandwidth` and `kubernetes.io/egress-bandwidth` pod
//! annotations, only where the operator configured a cap: per product (id, else category) or globally.
//! No cap by default: a cap applies to every byte of a pod, the traffic between an MPI job's ranks
//! included, so a default would throttle the multi-node jobs the cluster exists for (UCloud left the
//! annotations commented out, so it never capped). They take effect with a CNI that has the bandwidth
//! plugin.

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
        let caps = cx
            .pipeline()
            .network_limit
            .caps_for(&cx.product.id, &cx.product.category);
        for (annotation, key, value) in [
            (
                INGRESS_ANNOTATION,
                "network_limit.ingress_bandwidth",
                caps.ingress_bandwidth,
            ),
            (
                EGRESS_ANNOTATION,
                "network_limit.egress_bandwidth",
                caps.egress_bandwidth,
            ),
        ] {
            if let Some(value) = value {
                if !names::is_quantity(&value) {
                    return Err(PipelineError::config(
                        key,
                        format!("`{value}` is not a quantity"),
                    ));
                }
                draft.annotate_pods(annotation, value);
            }
        }
        Ok(())
    }
}
