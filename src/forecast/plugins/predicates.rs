//! Volcano's `predicates` plugin: which nodes a rank may go to. Here that is the upstream
//! `TaintToleration` filter over the two taints volcano-runner writes: a node reserved for a gang, and a
//! maintenance window's.

/// Which nodes a gang may use in the replay: those reserved for nobody waiting, and those reserved for
/// it; a gang that holds reserved nodes is placed only on them (it starts there by the time they empty,
/// whatever else frees, which is what makes its estimate a bound).
#[derive(Clone, Copy)]
pub(crate) struct Access<'a> {
    pub(crate) reserved: &'a [Option<usize>],
    pub(crate) me: usize,
    pub(crate) own_only: bool,
    /// The nodes a maintenance window's taint keeps the gang off for now (see
    /// [`crate::forecast::windows::Maintenance::off_nodes`]).
    pub(crate) off: Option<&'a [bool]>,
}

impl Access<'_> {
    pub(crate) fn may(&self, node: usize) -> bool {
        if self
            .off
            .is_some_and(|off| off.get(node).copied().unwrap_or(false))
        {
            return false;
        }
        match self.reserved.get(node).copied().flatten() {
            Some(g) => g == self.me,
            None => !self.own_only,
        }
    }
}
