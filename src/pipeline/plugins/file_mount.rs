//! FileMount: input files and folders, extra folders and the output folder become mounts of the one
//! storage volume (`data`, the PVC `storage.claim_name`), each with `subPath` = `<subfolder>/<path>`.
//!
//! - The output folder is mounted read-write at `/work` (first, so the file mounts land inside it).
//! - Every other path is mounted at `/work/<basename>`, read-only when any use of it asks for read-only.
//!   A path used twice is mounted once (paths are compared after normalising `//`, `.` and a trailing `/`).
//! - W24: two different paths with the same basename get distinct mount points instead of a pod the
//!   cluster rejects: the first keeps `/work/x.csv`, the next gets `/work/x-2.csv` (the extension stays, so
//!   programs that look at it still work), and so on. The argument a program receives is always its
//!   mount point: the Parameter plugin asks the same
//!   [`MountPlan`](crate::pipeline::mounts::MountPlan), planned once per render ([`crate::pipeline::mounts`]).
//! - Paths with `..` are refused (they would escape the storage subfolder).
//! - With an output folder, every rank's output is also kept there ([`super::output_files`]).
//! - A traced job gets its tracer ([`super::traced`]), after the output wrapper.

use k8s_openapi::api::core::v1::{PersistentVolumeClaimVolumeSource, Volume, VolumeMount};

use super::{Plugin, PluginId};
use crate::pipeline::PipelineError;
use crate::pipeline::context::Context;
use crate::pipeline::draft::Draft;
use crate::pipeline::mounts::VOLUME;

/// The FileMount plugin; the module documentation says what it builds and why.
pub struct FileMount;

impl Plugin for FileMount {
    fn id(&self) -> PluginId {
        PluginId::FileMount
    }

    fn build(&self, cx: &Context<'_>, draft: &mut Draft) -> Result<(), PipelineError> {
        let plan = &cx.mounts;
        if plan.is_empty() {
            return super::traced::build(cx, draft);
        }
        for m in plan.output.iter().chain(&plan.mounts) {
            draft.mount(VolumeMount {
                name: VOLUME.to_owned(),
                mount_path: m.mount_path.clone(),
                sub_path: Some(m.sub_path.clone()),
                read_only: Some(m.read_only),
                ..VolumeMount::default()
            });
        }
        draft.add_volume(Volume {
            name: VOLUME.to_owned(),
            persistent_volume_claim: Some(PersistentVolumeClaimVolumeSource {
                claim_name: cx.pipeline().storage.claim_name.clone(),
                read_only: Some(false),
            }),
            ..Volume::default()
        });
        super::output_files::build(cx, draft)?;
        super::traced::build(cx, draft)
    }
}
