//! The kinds of primitive: [`Kind`], the one name of each kind that the CLI, the metrics' `kind`
//! label, the spans and the keys use.

use std::fmt;

/// The kind of primitive a key belongs to: which of a name's keys [`Client::inspect`](crate::Client::inspect) and
/// [`Client::force_unlock`](crate::Client::force_unlock) act on (every kind of one name has its own key, in one slot).
///
/// # Examples
///
/// ```
/// use fencelock::Kind;
///
/// assert_eq!(Kind::ReadWrite.as_str(), "rwlock");
/// assert_eq!("semaphore".parse::<Kind>(), Ok(Kind::Semaphore));
/// ```
///
/// With the `serde` feature it serializes as [`Kind::as_str`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
#[cfg_attr(
    feature = "serde",
    derive(serde::Serialize),
    serde(rename_all = "lowercase")
)]
#[non_exhaustive]
pub enum Kind {
    /// The mutex (`Client::lock`), key `<prefix>:{NAME}:lock`.
    Mutex,
    /// The read-write lock (`Client::read_lock`/`write_lock`), key `…:rw`.
    #[cfg_attr(feature = "serde", serde(rename = "rwlock"))]
    ReadWrite,
    /// The fair lock (`Client::fair_lock`), key `…:fair`.
    Fair,
    /// The semaphore (`Client::semaphore`), key `…:sem`.
    Semaphore,
    /// The countdown latch (`Client::latch`), key `…:latch`.
    Latch,
}

impl Kind {
    /// Every kind, in this order.
    pub const ALL: [Kind; 5] = [
        Kind::Mutex,
        Kind::ReadWrite,
        Kind::Fair,
        Kind::Semaphore,
        Kind::Latch,
    ];

    /// The kind's name: `mutex`, `rwlock`, `fair`, `semaphore`, `latch` (what the CLI prints
    /// and [`FromStr`](std::str::FromStr) reads).
    pub const fn as_str(self) -> &'static str {
        match self {
            Kind::Mutex => "mutex",
            Kind::ReadWrite => "rwlock",
            Kind::Fair => "fair",
            Kind::Semaphore => "semaphore",
            Kind::Latch => "latch",
        }
    }

    /// The last part of the kind's keys (`lock`, `rw`, `fair`, `sem`, `latch`).
    pub const fn key_suffix(self) -> &'static str {
        match self {
            Kind::Mutex => "lock",
            Kind::ReadWrite => "rw",
            Kind::Fair => "fair",
            Kind::Semaphore => "sem",
            Kind::Latch => "latch",
        }
    }

    /// The kind whose keys end in `suffix`.
    pub(crate) fn from_suffix(suffix: &str) -> Option<Kind> {
        Kind::ALL.into_iter().find(|k| k.key_suffix() == suffix)
    }
}

impl fmt::Display for Kind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl std::str::FromStr for Kind {
    type Err = String;

    /// Reads a kind's name ([`Kind::as_str`]) or its key suffix (`lock`, `rw`, `sem`).
    fn from_str(text: &str) -> std::result::Result<Self, Self::Err> {
        Kind::ALL
            .into_iter()
            .find(|k| k.as_str() == text || k.key_suffix() == text)
            .ok_or_else(|| {
                format!("unknown kind {text:?}: use mutex, rwlock, fair, semaphore or latch")
            })
    }
}
