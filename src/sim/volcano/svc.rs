//! The svc plugin at the end of a job. Volcano's job controller kills a job that has finished
//! (`killJob`, from the states Completed, Failed and Terminated on) and calls every plugin's
//! `OnJobDelete` on the way: the svc plugin deletes the hosts ConfigMap `<job>-svc`, the headless
//! Service `<job>` and, unless `--disable-network-policy`, the NetworkPolicy `<job>`, and takes
//! `plugin-svc` out of `status.controlledResources`. A job kept for its `ttlSecondsAfterFinished` is
//! thus kept without them; without this the simulator kept both objects of every ended job for the
//! whole retention.
//!
//! Not modelled: Volcano calls `killJob` also when a job is aborted or restarted, and creates the
//! objects again when the job is Pending once more. The simulator creates them once, at the job's
//! first sight, so it lets them go only where no way back exists: the phases the TTL collector counts.

use serde_json::Value;

use crate::sim::api::{Core, name_of};
use crate::sim::json::JsonPath;

/// The key of the svc plugin in `status.controlledResources`.
const CONTROLLED: &str = "plugin-svc";

/// When the job is `finished` (in a phase it never leaves: those the TTL collector counts) and
/// `status` still names the svc plugin's objects: deletes them (gone already is fine) and takes the
/// plugin out of `status.controlledResources`, which the caller writes. Once per job: afterwards the
/// status no longer names them.
pub(super) fn release_when_finished(
    core: &mut Core,
    job: &Value,
    finished: bool,
    status: &mut Value,
) {
    if !finished {
        return;
    }
    let Some(controlled) = status
        .get_mut("controlledResources")
        .and_then(Value::as_object_mut)
    else {
        return;
    };
    if controlled.remove(CONTROLLED).is_none() {
        return;
    }
    let ns = crate::sim::api::namespace_of(job).to_string();
    let name = name_of(job).to_string();
    let network_policy = !job
        .at("/spec/plugins/svc")
        .and_then(Value::as_array)
        .is_some_and(|args| {
            args.iter().any(|a| {
                matches!(
                    a.as_str(),
                    Some("--disable-network-policy" | "--disable-network-policy=true")
                )
            })
        });
    let mut gone = vec![
        core.key_of(core.ids.configmaps, &ns, &format!("{name}-svc")),
        core.key_of(core.ids.services, &ns, &name),
    ];
    if network_policy {
        gone.push(core.key_of(core.ids.networkpolicies, &ns, &name));
    }
    for key in gone {
        core.delete_key(&key, None, None);
    }
}
