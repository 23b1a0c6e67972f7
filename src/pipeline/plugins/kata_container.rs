//! KataContainer: for the products (ids or categories) listed in `kata.products`, the pod runs in a Kata
//! VM selected by `runtimeClassName` (not UCloud's deprecated `io.kubernetes.cri.untrusted-workload`
//! annotation, W30), and the container's cpu and memory are reduced by the VM's own overhead: the VM boots
//! with a base size and the container's request is hot-plugged on top, so without the reduction the VM
//! would be larger than the product (UCloud: cpu − 1 vCPU, at least 1; memory − 6 GiB, at least 1 GiB).
//! Other resources (GPUs) are kept.

use k8s_openapi::apimachinery::pkg::api::resource::Quantity;

use super::{Plugin, PluginId};
use crate::pipeline::PipelineError;
use crate::pipeline::context::Context;
use crate::pipeline::draft::Draft;

/// The KataContainer plugin; the module documentation says what it builds and why.
pub struct KataContainer;

impl Plugin for KataContainer {
    fn id(&self) -> PluginId {
        PluginId::KataContainer
    }

    fn build(&self, cx: &Context<'_>, draft: &mut Draft) -> Result<(), PipelineError> {
        let config = &cx.pipeline().kata;
        let product = cx.product;
        if !config
            .products
            .iter()
            .any(|p| *p == product.id || *p == product.category)
        {
            return Ok(());
        }
        draft.pod.runtime_class_name = Some(config.runtime_class_name.clone());
        let cpu = (product.cpu > 0).then(|| {
            let millis = u64::from(product.cpu) * 1000;
            millis
                .saturating_sub(config.cpu_overhead_millis)
                .max(config.min_cpu_millis)
        });
        let memory = (product.memory_gib > 0).then(|| {
            let mib = u64::from(product.memory_gib) * 1024;
            mib.saturating_sub(config.memory_overhead_mib)
                .max(config.min_memory_mib)
        });
        if let Some(resources) = &mut draft.user.resources {
            for map in [&mut resources.limits, &mut resources.requests]
                .into_iter()
                .flatten()
            {
                if let Some(cpu) = cpu {
                    map.insert("cpu".to_owned(), Quantity(format!("{cpu}m")));
                }
                if let Some(memory) = memory {
                    map.insert("memory".to_owned(), Quantity(format!("{memory}Mi")));
                }
            }
        }
        Ok(())
    }
}
