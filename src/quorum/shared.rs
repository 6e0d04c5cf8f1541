//! What a quorum client and its guards share: the deployments (each client once connected,
//! and how to connect it again in the background) and the quorum's settings.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use crate::client::{Client, ClientBuilder};
use crate::fence::FenceToken;

/// How often a deployment that could not be reached at connect is tried again, at most.
const RECONNECT_EVERY: Duration = Duration::from_millis(500);

/// One deployment: its client once connected, and how to connect again.
pub(super) struct Deployment {
    builder: ClientBuilder,
    client: Mutex<Option<Client>>,
    reconnecting: AtomicBool,
    last_try: Mutex<Instant>,
}

impl Deployment {
    /// A deployment built by `builder`, with its `client` if connected now (tried again in the
    /// background otherwise, see [`Shared::client`]).
    pub(super) fn new(builder: ClientBuilder, client: Option<Client>) -> Self {
        Self {
            builder,
            client: Mutex::new(client),
            reconnecting: AtomicBool::new(false),
            last_try: Mutex::new(Instant::now()),
        }
    }
}

/// What a quorum client and its guards share.
pub(super) struct Shared {
    pub(super) deployments: Vec<Deployment>,
    pub(super) majority: usize,
    pub(super) drift: Duration,
    pub(super) request_timeout: Duration,
    pub(super) prefix: String,
    pub(super) skip_commit: bool,
    /// The highest [`ClientBuilder::fence_floor`] of the deployments: every grant is above it.
    pub(super) fence_floor: Option<FenceToken>,
}

impl Shared {
    /// Deployment `index`'s client if connected; otherwise a background connect is started (at
    /// most every [`RECONNECT_EVERY`]) and `None` answered.
    pub(super) fn client(self: &Arc<Self>, index: usize) -> Option<Client> {
        let deployment = &self.deployments[index];
        if let Some(client) = lock(&deployment.client).as_ref() {
            return Some(client.clone());
        }
        let due = lock(&deployment.last_try).elapsed() >= RECONNECT_EVERY;
        if due && !deployment.reconnecting.swap(true, Ordering::AcqRel) {
            if let Ok(runtime) = tokio::runtime::Handle::try_current() {
                let shared = Arc::clone(self);
                runtime.spawn(async move {
                    let deployment = &shared.deployments[index];
                    let outcome = deployment.builder.clone().connect().await;
                    *lock(&deployment.last_try) = Instant::now();
                    match outcome {
                        Ok(client) => *lock(&deployment.client) = Some(client),
                        Err(err) => {
                            tracing::debug!(
                                deployment = index,
                                error = %err,
                                "deployment still not reachable"
                            );
                        }
                    }
                    deployment.reconnecting.store(false, Ordering::Release);
                });
            } else {
                deployment.reconnecting.store(false, Ordering::Release);
            }
        }
        None
    }

    /// Each deployment's client as it stands, `None` while not connected (no reconnect is
    /// started).
    pub(super) fn connected(&self) -> Vec<Option<Client>> {
        self.deployments
            .iter()
            .map(|d| lock(&d.client).clone())
            .collect()
    }

    /// The allowance for clock drift over a lease of `ttl`: TTL/100 + the constant part.
    pub(super) fn allowance(&self, ttl: Duration) -> Duration {
        ttl / 100 + self.drift
    }
}

/// Locks `mutex`, poisoned or not (what it guards stays consistent: one assignment).
fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(PoisonError::into_inner)
}
