//! The surface every guard shares: each primitive's guard wraps one
//! [`Held`](crate::held::Held) in a `held` field and gets its accessors, `lost`, `extend` and
//! `release` from [`guard_surface!`], with documentation written once and worded for the
//! primitive (what it holds, how it is taken, what its release does).

/// The public methods of a guard over `held`: `name`, `keys`, `valid_until`, `is_valid`,
/// `replicas_acked`, `lost`, `extend` and `release`.
///
/// - `what`: what the guard holds ("lock", "hold", "permits"), as the docs name it;
/// - `take`: an expression taking such a guard with the watchdog on, for the `lost` example
///   (`client` is a [`Client`](crate::Client), `LockOptions` is in scope);
/// - `extend`: what `extend` adds to the lease rule (may be empty);
/// - `release`: what `release` does, one sentence.
macro_rules! guard_surface {
    (what: $what:literal, take: $take:literal, extend: $extend:literal, release: $release:literal $(,)?) => {
        $crate::held::held_accessors!($what);

        #[doc = concat!("Resolves when this ", $what, " can no longer be relied on, with the reason: the")]
        /// watchdog found it expired ([`Error::Expired`](crate::Error::Expired)), freed by a
        /// forced unlock ([`Error::ForceUnlocked`](crate::Error::ForceUnlocked)) or held by
        /// another owner ([`Error::NotOwner`](crate::Error::NotOwner)), it could not renew it
        /// before the lease ran out ([`Error::LeaseUnconfirmed`](crate::Error::LeaseUnconfirmed)),
        /// Redis refused a renewal with an error that retrying does not cure, such as the key
        /// overwritten with another type ([`Error::RenewalFailed`](crate::Error::RenewalFailed)),
        /// or the maximum hold time passed ([`Error::MaxHoldReached`](crate::Error::MaxHoldReached)).
        /// Without the watchdog it resolves with [`Error::Expired`](crate::Error::Expired) at
        /// [`valid_until`](Self::valid_until).
        ///
        /// Race it against the work it protects, and stop the work when it resolves.
        ///
        /// # Examples
        ///
        /// ```no_run
        /// # async fn run(client: fencelock::Client) -> fencelock::Result<()> {
        /// # async fn long_job(_fence: fencelock::FenceToken) {}
        /// use fencelock::LockOptions;
        ///
        #[doc = concat!("let guard = ", $take, ".await?;")]
        /// tokio::select! {
        ///     () = long_job(guard.fence()) => guard.release().await?,
        ///     lost = guard.lost() => eprintln!("stopped: {lost}"),
        /// }
        /// # Ok(()) }
        /// ```
        ///
        /// # Cancel safety
        ///
        /// Cancel safe: it only watches.
        pub async fn lost(&self) -> $crate::Error {
            self.held.lost().await
        }

        #[doc = concat!("Resets the lease of this ", $what, " to `ttl` if this guard still holds it, and")]
        #[doc = concat!("returns the new [`valid_until`](Self::valid_until). ", $extend)]
        ///
        /// # Errors
        ///
        #[doc = concat!("[`Error::Expired`](crate::Error::Expired) when the ", $what, "'s lease had ended,")]
        /// [`Error::ForceUnlocked`](crate::Error::ForceUnlocked) when a
        /// [`force_unlock`](crate::Client::force_unlock) freed it,
        /// [`Error::NotOwner`](crate::Error::NotOwner) when another owner holds it now (the
        /// guard stays unusable for writes); [`Error::InvalidOptions`](crate::Error::InvalidOptions)
        /// for a bad TTL; [`Error::Timeout`](crate::Error::Timeout) or
        /// [`Error::Redis`](crate::Error::Redis) when Redis does not answer.
        ///
        /// # Cancel safety
        ///
        /// Cancel safe: a dropped call leaves the guard usable (the lease may or may not have
        /// been reset); `valid_until` keeps the earlier of the old lease end and the one asked
        /// for, so a shortening that reached Redis is never overlooked.
        pub async fn extend(
            &mut self,
            ttl: std::time::Duration,
        ) -> $crate::Result<std::time::Instant> {
            self.held.extend(ttl).await
        }

        #[doc = concat!($release, " Stops the watchdog for it.")]
        ///
        /// # Errors
        ///
        #[doc = concat!("[`Error::Expired`](crate::Error::Expired) when the ", $what, "'s lease had ended,")]
        /// [`Error::ForceUnlocked`](crate::Error::ForceUnlocked) when a
        /// [`force_unlock`](crate::Client::force_unlock) freed it,
        /// [`Error::NotOwner`](crate::Error::NotOwner) when another owner holds it now (it is
        /// left alone) — each means writes made late under its fence may have been rejected;
        /// [`Error::Timeout`](crate::Error::Timeout) or [`Error::Redis`](crate::Error::Redis)
        #[doc = concat!("when Redis does not answer (the ", $what, " then ends with its lease).")]
        ///
        /// # Cancel safety
        ///
        /// Cancel safe: if the call is dropped before Redis answers, the guard's drop releases
        #[doc = concat!("the ", $what, " in the background.")]
        pub async fn release(self) -> $crate::Result<()> {
            self.held.release().await
        }
    };
}
pub(crate) use guard_surface;
