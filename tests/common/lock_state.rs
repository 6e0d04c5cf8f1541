//! The packed state of a fencelock mutex or fair lock (key layout 2, `docs/design.md`), read
//! and written by hand, and the decoding of a granting script's reply.

use super::Node;

impl Node {
    /// One part of the state of fencelock mutex or fair lock `key` (key layout 2: the hash
    /// field `until` packs "<lease end> <fence> <owner>[ h<holds>][ w<waiters>]"): `owner`,
    /// `until` (the lease end), `fence`, `holds` or `waiters`, `None` where absent (a free
    /// lock has no owner and no lease end).
    pub fn lock_field(&self, key: &str, field: &str) -> Option<String> {
        let state: Option<String> = self.cmd(redis::cmd("HGET").arg(key).arg("until"));
        LockState::parse(state.as_deref()?).get(field)
    }

    /// Sets one part of the state of fencelock mutex or fair lock `key` (see
    /// [`lock_field`](Self::lock_field)), creating the state of a free lock if there is none.
    pub fn set_lock_field(&self, key: &str, field: &str, value: &str) {
        let state: Option<String> = self.cmd(redis::cmd("HGET").arg(key).arg("until"));
        let mut state = state.map(|s| LockState::parse(&s)).unwrap_or_default();
        state.set(field, value);
        self.cmd::<()>(
            redis::cmd("HSET")
                .arg(key)
                .arg("until")
                .arg(state.to_string()),
        );
    }
}

/// The state of a fencelock mutex or fair lock in key layout 2 (see [`Node::lock_field`]).
#[derive(Debug, Default, Clone)]
pub struct LockState {
    pub until: String,
    pub fence: String,
    pub owner: String,
    pub holds: Option<String>,
    pub waiters: Option<String>,
}

impl LockState {
    pub fn parse(state: &str) -> LockState {
        let mut parts = state.splitn(4, ' ');
        let mut s = LockState {
            until: parts.next().unwrap_or("0").to_owned(),
            fence: parts.next().unwrap_or("0").to_owned(),
            owner: parts.next().unwrap_or("").to_owned(),
            ..LockState::default()
        };
        for mark in parts.next().unwrap_or("").split(' ') {
            if let Some(h) = mark.strip_prefix('h') {
                s.holds = Some(h.to_owned());
            } else if let Some(w) = mark.strip_prefix('w') {
                s.waiters = Some(w.to_owned());
            }
        }
        s
    }

    pub fn get(&self, field: &str) -> Option<String> {
        match field {
            "owner" => (!self.owner.is_empty()).then(|| self.owner.clone()),
            "until" => (self.until != "0" && !self.until.is_empty()).then(|| self.until.clone()),
            "fence" => Some(self.fence.clone()),
            "holds" => self.holds.clone(),
            "waiters" => self.waiters.clone(),
            other => panic!("no lock state part {other}"),
        }
    }

    pub fn set(&mut self, field: &str, value: &str) {
        match field {
            "owner" => self.owner = value.to_owned(),
            "until" => self.until = value.to_owned(),
            "fence" => self.fence = value.to_owned(),
            "holds" => self.holds = Some(value.to_owned()),
            "waiters" => self.waiters = Some(value.to_owned()),
            other => panic!("no lock state part {other}"),
        }
    }
}

impl std::fmt::Display for LockState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let until = if self.until.is_empty() {
            "0"
        } else {
            &self.until
        };
        let fence = if self.fence.is_empty() {
            "0"
        } else {
            &self.fence
        };
        write!(f, "{until} {fence} {}", self.owner)?;
        if let Some(h) = &self.holds {
            write!(f, " h{h}")?;
        }
        if let Some(w) = &self.waiters {
            write!(f, " w{w}")?;
        }
        Ok(())
    }
}

/// A granting script's reply as integers: the mutex's acquire answers a plain grant with its
/// fence alone (`fence` for `{1, fence, 0}`), every other reply is an array.
pub fn grant_values(reply: redis::Value) -> Vec<i64> {
    match reply {
        redis::Value::Int(fence) => vec![1, fence, 0],
        other => redis::from_redis_value(other).expect("an array of integers"),
    }
}
