//! The scheduler's plugins the forecast follows, one file each, named as Volcano names them.

pub mod gang;
pub mod nodeorder;
pub mod overcommit;
pub mod predicates;
pub mod proportion;
pub mod sla;
