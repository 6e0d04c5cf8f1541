//! `Serialize`/`Deserialize` for [`LockOptions`] (the `serde` feature).
//!
//! The form is a flat map; every field is optional on input and takes its default:
//!
//! ```text
//! { "ttl": "30s", "timeout": "10s", "wait_replicas": { "replicas": 1, "timeout": "100ms" },
//!   "slot": 12739, "tag": "orders", "floor": 42, "watchdog": true,
//!   "renew_every": "5s", "max_hold": "1h", "linger": true }
//! ```
//!
//! Durations are humantime strings (`"300ms"`, `"1m 30s"`, `"2h 15m"`), as the CLI takes them,
//! so configuration files read naturally; `"forever"` stands for `Duration::MAX` (a timeout or
//! maximum hold without end). `slot` and `tag` are exclusive. The [`LockOptions::on_wait`]
//! observer is not serialized.

use std::time::Duration;

use serde::de::Error as _;
use serde::{Deserialize, Deserializer, Serialize, Serializer};

use crate::fence::FenceToken;
use crate::keys::Placement;
use crate::options::LockOptions;

/// A duration as a humantime string.
#[derive(Clone, Copy)]
struct Human(Duration);

const FOREVER: &str = "forever";

impl Serialize for Human {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        if self.0 == Duration::MAX {
            return serializer.serialize_str(FOREVER);
        }
        serializer.collect_str(&humantime::format_duration(self.0))
    }
}

impl<'de> Deserialize<'de> for Human {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let text = String::deserialize(deserializer)?;
        if text.trim() == FOREVER {
            return Ok(Human(Duration::MAX));
        }
        humantime::parse_duration(&text).map(Human).map_err(|e| {
            D::Error::custom(format!(
                "{text:?} is not a duration ({e}): write e.g. \"300ms\", \"10s\", \"1m 30s\""
            ))
        })
    }
}

#[derive(Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct WaitRepr {
    replicas: u32,
    timeout: Human,
}

#[derive(Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct Repr {
    #[serde(default)]
    ttl: Option<Human>,
    #[serde(default)]
    timeout: Option<Human>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    wait_replicas: Option<WaitRepr>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    slot: Option<u16>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    tag: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    floor: Option<u64>,
    #[serde(default)]
    watchdog: Option<bool>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    renew_every: Option<Human>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    max_hold: Option<Human>,
    #[serde(default, skip_serializing_if = "is_false")]
    linger: bool,
}

fn is_false(on: &bool) -> bool {
    !on
}

impl Serialize for LockOptions {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        let (slot, tag) = match &self.placement {
            Placement::ByName => (None, None),
            Placement::Slot(slot) => (Some(*slot), None),
            Placement::Tag(tag) => (None, Some(tag.clone())),
        };
        Repr {
            ttl: Some(Human(self.ttl)),
            timeout: Some(Human(self.timeout)),
            wait_replicas: self.wait.map(|(replicas, timeout)| WaitRepr {
                replicas,
                timeout: Human(timeout),
            }),
            slot,
            tag,
            floor: self.floor.map(FenceToken::get),
            watchdog: Some(self.watchdog),
            renew_every: self.renew_every.map(Human),
            max_hold: self.max_hold.map(Human),
            linger: self.linger,
        }
        .serialize(serializer)
    }
}

impl<'de> Deserialize<'de> for LockOptions {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let repr = Repr::deserialize(deserializer)?;
        let defaults = LockOptions::default();
        let placement = match (repr.slot, repr.tag) {
            (Some(_), Some(_)) => {
                return Err(D::Error::custom(
                    "`slot` and `tag` both given: a lock is placed by one of them",
                ))
            }
            (Some(slot), None) => Placement::Slot(slot),
            (None, Some(tag)) => Placement::Tag(tag),
            (None, None) => Placement::ByName,
        };
        let floor = match repr.floor {
            None => None,
            Some(value) => Some(FenceToken::new(value).ok_or_else(|| {
                D::Error::custom(format!("floor {value} is not a valid fence token"))
            })?),
        };
        Ok(LockOptions {
            ttl: repr.ttl.map_or(defaults.ttl, |h| h.0),
            timeout: repr.timeout.map_or(defaults.timeout, |h| h.0),
            wait: repr.wait_replicas.map(|w| (w.replicas, w.timeout.0)),
            placement,
            floor,
            watchdog: repr.watchdog.unwrap_or(defaults.watchdog),
            renew_every: repr.renew_every.map(|h| h.0),
            max_hold: repr.max_hold.map(|h| h.0),
            linger: repr.linger,
            on_wait: None,
        })
    }
}
