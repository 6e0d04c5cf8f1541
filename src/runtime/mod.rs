//! The client's background machinery: wake-ups on release and the watchdog that renews held
//! leases. Their tasks hold the transport and the counters, never a client.

pub(crate) mod lease;
pub(crate) mod wakeups;
pub(crate) mod watchdog;
