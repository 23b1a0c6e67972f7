//! The route table of the running interactive jobs, below both its users: the proxy-sync role
//! ([`crate::proxy`]), which keeps it from the proxy events and the cluster and writes it for Envoy and
//! Caddy, and the session check ([`crate::sessions`]), which answers every request from it.
//!
//! - [`table`]: [`RouteTable`], the routes by job, and the rule that orders updates (pure).
//! - [`Routes`]: the table shared between the loop that changes it and its readers.

pub mod table;

use std::sync::{Arc, RwLock};

use tokio::sync::watch;

pub use table::{Applied, Backend, HostNaming, JobRoutes, JobUpdate, Route, RouteTable, Stamp};

/// The table, shared between the loop (which changes it) and readers (the Envoy writer, tests). Cheap
/// to clone. The lock is never held across an await.
#[derive(Debug, Clone)]
pub struct Routes {
    table: Arc<RwLock<RouteTable>>,
    version: Arc<watch::Sender<u64>>,
}

impl Default for Routes {
    fn default() -> Self {
        Self {
            table: Arc::default(),
            version: Arc::new(watch::channel(0).0),
        }
    }
}

impl Routes {
    /// Routes holding `table`, for a check or a benchmark without a running instance.
    pub fn from_table(table: RouteTable) -> Self {
        Self {
            table: Arc::new(RwLock::new(table)),
            version: Arc::new(watch::channel(0).0),
        }
    }

    /// Reads the table.
    pub fn read<R>(&self, f: impl FnOnce(&RouteTable) -> R) -> R {
        f(&self.table.read().unwrap_or_else(|e| e.into_inner()))
    }

    /// The table's version: one more with every change.
    pub fn version(&self) -> u64 {
        *self.version.borrow()
    }

    /// A receiver that changes whenever the table does.
    pub fn subscribe(&self) -> watch::Receiver<u64> {
        self.version.subscribe()
    }

    /// Changes the table; readers are told when `f` says it changed.
    pub(crate) fn change<R>(&self, f: impl FnOnce(&mut RouteTable) -> (R, bool)) -> R {
        let (result, changed) = f(&mut self.table.write().unwrap_or_else(|e| e.into_inner()));
        if changed {
            self.version.send_modify(|v| *v += 1);
        }
        result
    }

    pub(crate) fn apply(&self, update: JobUpdate) -> Applied {
        self.change(|t| {
            let applied = t.apply(update);
            (applied, applied == Applied::Changed)
        })
    }
}
