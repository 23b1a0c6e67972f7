//! SharedMemory: `/dev/shm` as a memory-backed `emptyDir` sized to the job's memory (1 GiB when the
//! product has none), because the container runtime's default 64 MiB breaks MPI, PyTorch data loaders and
//! the like. Usage counts against the container's memory limit.

use k8s_openapi::api::core::v1::{EmptyDirVolumeSource, Volume, VolumeMount};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;

use super::{Plugin, PluginId};
use crate::pipeline::PipelineError;
use crate::pipeline::context::Context;
use crate::pipeline::draft::Draft;

/// The volume's name.
pub const VOLUME: &str = "shm";

/// The SharedMemory plugin; the module documentation says what it builds and why.
pub struct SharedMemory;

impl Plugin for SharedMemory {
    fn id(&self) -> PluginId {
        PluginId::SharedMemory
    }

    fn build(&self, cx: &Context<'_>, draft: &mut Draft) -> Result<(), PipelineError> {
        let gib = if cx.product.memory_gib == 0 {
            1
        } else {
            cx.product.memory_gib
        };
        draft.add_volume(Volume {
            name: VOLUME.to_owned(),
            empty_dir: Some(EmptyDirVolumeSource {
                medium: Some("Memory".to_owned()),
                size_limit: Some(Quantity(format!("{gib}Gi"))),
            }),
            ..Volume::default()
        });
        draft.mount(VolumeMount {
            name: VOLUME.to_owned(),
            mount_path: "/dev/shm".to_owned(),
            ..VolumeMount::default()
        });
        Ok(())
    }
}
