//! Volcano's `overcommit` plugin: the room the `enqueue` action admits gangs within.

use crate::forecast::snapshot::Resources;

/// Volcano's default over-commit factor for admission (the `overcommit` plugin's
/// `overcommit-factor`, 1.2), as a fraction.
pub(crate) const OVERCOMMIT: (u64, u64) = (6, 5);

/// Whether a gang asking for `minimum` is admitted while `idle` is free and the admitted gangs that
/// wait ask for `admitted`: `minimum <= idle × factor - admitted` for every resource it asks for.
pub(crate) fn admissible(minimum: &Resources, idle: &Resources, admitted: &Resources) -> bool {
    let room = |idle: u64, admitted: u64| {
        (idle.saturating_mul(OVERCOMMIT.0) / OVERCOMMIT.1).saturating_sub(admitted)
    };
    (minimum.cpu_milli == 0 || minimum.cpu_milli <= room(idle.cpu_milli, admitted.cpu_milli))
        && (minimum.memory_mib == 0
            || minimum.memory_mib <= room(idle.memory_mib, admitted.memory_mib))
        && (minimum.gpu == 0 || minimum.gpu <= room(idle.gpu, admitted.gpu))
}
