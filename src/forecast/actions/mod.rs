//! The scheduler's actions the forecast follows, named as Volcano names them.

pub mod allocate;
