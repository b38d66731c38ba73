//! Tokens checked a moment ago, so a signed-in request does not read the store
//! each time (a store read was most of what a small query cost).
//!
//! What may be kept, and for how long:
//! - Only tokens found in the store for a user who is not disabled: an unknown
//!   token is never kept, so nobody can fill the map by guessing.
//! - An entry is used for [`FRESH`] at most, and its expiry is checked at each
//!   use. A change made through [`super::Auth`] (a token revoked, a session
//!   ended, a user disabled, deleted or given another role) forgets every
//!   entry before the change is answered; [`FRESH`] bounds what a change made
//!   elsewhere (another process on the same database) can miss.
//! - A read that began before such a change does not put its (stale) answer
//!   back: each change moves a generation, and an answer read under an older
//!   one is dropped.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use chrono::{DateTime, Utc};

use super::Principal;

/// Longest an entry answers without a new read of the store.
pub const FRESH: Duration = Duration::from_secs(5);
/// Most entries kept; when full, the map starts again (only valid tokens are
/// kept, so it fills only with that many tokens in use within [`FRESH`]).
const MAX_ENTRIES: usize = 4096;

/// What was read for one token (by its hash).
#[derive(Clone)]
pub struct Checked {
    pub principal: Principal,
    pub expires_at: Option<DateTime<Utc>>,
    pub last_used_at: Option<DateTime<Utc>>,
}

struct Entry {
    checked: Checked,
    read_at: Instant,
}

#[derive(Default)]
struct Inner {
    entries: HashMap<String, Entry>,
    generation: u64,
}

#[derive(Default)]
pub struct RecentTokens {
    inner: Mutex<Inner>,
}

impl RecentTokens {
    /// What was read for `hash` within [`FRESH`], if anything.
    pub fn get(&self, hash: &str, now: Instant) -> Option<Checked> {
        let inner = self.lock();
        let entry = inner.entries.get(hash)?;
        (now.duration_since(entry.read_at) < FRESH).then(|| entry.checked.clone())
    }

    /// The generation to hand back to [`Self::put`] with what is read next.
    pub fn generation(&self) -> u64 {
        self.lock().generation
    }

    /// Keeps what was read under `generation`, unless something changed since.
    pub fn put(&self, hash: String, checked: Checked, generation: u64, read_at: Instant) {
        let mut inner = self.lock();
        if inner.generation != generation {
            return;
        }
        if inner.entries.len() >= MAX_ENTRIES && !inner.entries.contains_key(&hash) {
            inner.entries.clear();
        }
        inner.entries.insert(hash, Entry { checked, read_at });
    }

    /// Records that `hash` was just marked used in the store.
    pub fn touched(&self, hash: &str, at: DateTime<Utc>) {
        if let Some(entry) = self.lock().entries.get_mut(hash) {
            entry.checked.last_used_at = Some(at);
        }
    }

    /// Forgets everything: who a token stands for may have changed.
    pub fn forget_all(&self) {
        let mut inner = self.lock();
        inner.generation += 1;
        inner.entries.clear();
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        // Nothing here can panic while holding the lock; a poisoned lock still
        // holds a consistent map.
        self.inner
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::auth::{Role, TokenKind, User};

    fn checked() -> Checked {
        Checked {
            principal: Principal {
                user: User {
                    id: uuid::Uuid::nil(),
                    username: "ann".into(),
                    role: Role::User,
                    has_password: false,
                    disabled: false,
                    created_at: Utc::now(),
                },
                token_id: uuid::Uuid::nil(),
                token_kind: TokenKind::Api,
            },
            expires_at: None,
            last_used_at: None,
        }
    }

    #[test]
    fn an_entry_answers_until_it_is_stale() {
        let recent = RecentTokens::default();
        let read_at = Instant::now();
        recent.put("h".into(), checked(), recent.generation(), read_at);
        assert!(recent.get("h", read_at + FRESH / 2).is_some());
        assert!(recent.get("h", read_at + FRESH).is_none());
        assert!(recent.get("other", read_at).is_none());
    }

    #[test]
    fn a_read_from_before_a_change_is_not_kept() {
        let recent = RecentTokens::default();
        let generation = recent.generation();
        // The token is revoked while its read is under way.
        recent.forget_all();
        let now = Instant::now();
        recent.put("h".into(), checked(), generation, now);
        assert!(recent.get("h", now).is_none());
        recent.put("h".into(), checked(), recent.generation(), now);
        assert!(recent.get("h", now).is_some());
        recent.forget_all();
        assert!(recent.get("h", now).is_none());
    }

    #[test]
    fn a_full_map_starts_again() {
        let recent = RecentTokens::default();
        let now = Instant::now();
        for i in 0..=MAX_ENTRIES {
            recent.put(i.to_string(), checked(), recent.generation(), now);
        }
        assert!(recent.get("0", now).is_none());
        assert!(recent.get(&MAX_ENTRIES.to_string(), now).is_some());
        assert!(recent.lock().entries.len() <= MAX_ENTRIES);
    }
}
