//! Login rate limiting: failed attempts per user name and per client address,
//! in token buckets of fixed memory.
//!
//! Each kind (names, addresses) is a fixed table of buckets. A key is hashed
//! with two process-random keys onto two buckets; a failure takes a token from
//! both, and the key is refused only while both are empty (a count-min sketch:
//! another key sharing one bucket cannot lock it out, and without the random
//! keys nobody can aim at both). So an attacker sending a million user names
//! fills no memory, and a name that does not exist is limited like one that
//! does (refusals do not tell which names exist).
//!
//! An attempt takes its token when it starts ([`LoginLimiter::attempt`], the
//! check and the take under one lock) and a success gives it back
//! ([`LoginLimiter::succeeded`]): so the limit only trips on failures, and a
//! burst of concurrent attempts cannot all pass the check before any of them
//! has failed.

use std::collections::hash_map::RandomState;
use std::hash::BuildHasher;
use std::net::IpAddr;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use super::settings::LoginLimits;

pub struct LoginLimiter {
    users: Table,
    addresses: Table,
}

/// Which limit refused a login, and for how long.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Limited {
    pub by: LimitedBy,
    pub retry_after: Duration,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LimitedBy {
    User,
    Address,
}

impl LoginLimiter {
    pub fn new(limits: &LoginLimits) -> Self {
        Self {
            users: Table::new(limits.tracked, limits.user_burst, limits.user_refill),
            addresses: Table::new(limits.tracked, limits.address_burst, limits.address_refill),
        }
    }

    /// Starts an attempt: `Err` when either the name or the address has no
    /// attempt left now; else one is taken from both, to be given back by
    /// [`succeeded`](Self::succeeded) (a failure keeps it).
    pub fn attempt(&self, user: &str, from: Option<IpAddr>, now: Instant) -> Result<(), Limited> {
        let address = from.map(address_key);
        // Both tables, always in this order, so the check and the take are one step.
        let mut addresses = self.addresses.lock();
        let mut users = self.users.lock();
        if let Some(key) = &address
            && let Some(retry_after) = self.addresses.wait(&addresses, key, now)
        {
            return Err(Limited {
                by: LimitedBy::Address,
                retry_after,
            });
        }
        if let Some(retry_after) = self.users.wait(&users, user.as_bytes(), now) {
            return Err(Limited {
                by: LimitedBy::User,
                retry_after,
            });
        }
        self.users.add(&mut users, user.as_bytes(), -1.0, now);
        if let Some(key) = &address {
            self.addresses.add(&mut addresses, key, -1.0, now);
        }
        Ok(())
    }

    /// The attempt succeeded: the token it took is given back.
    pub fn succeeded(&self, user: &str, from: Option<IpAddr>, now: Instant) {
        let mut users = self.users.lock();
        self.users.add(&mut users, user.as_bytes(), 1.0, now);
        drop(users);
        if let Some(addr) = from {
            let mut addresses = self.addresses.lock();
            self.addresses
                .add(&mut addresses, &address_key(addr), 1.0, now);
        }
    }
}

/// IPv4 addresses as they are; IPv6 by their /64, which one holder usually has
/// whole.
fn address_key(addr: IpAddr) -> Vec<u8> {
    match addr.to_canonical() {
        IpAddr::V4(v4) => v4.octets().to_vec(),
        IpAddr::V6(v6) => v6.octets()[..8].to_vec(),
    }
}

struct Table {
    buckets: Mutex<Vec<Bucket>>,
    hashers: [RandomState; 2],
    burst: f64,
    refill: Duration,
}

#[derive(Clone, Copy)]
struct Bucket {
    tokens: f64,
    /// When `tokens` was last brought up to date; `None` for a full bucket.
    at: Option<Instant>,
}

impl Table {
    fn new(size: usize, burst: u32, refill: Duration) -> Self {
        Self {
            buckets: Mutex::new(vec![
                Bucket {
                    tokens: f64::from(burst),
                    at: None,
                };
                size.max(1)
            ]),
            hashers: [RandomState::new(), RandomState::new()],
            burst: f64::from(burst),
            refill,
        }
    }

    fn slots(&self, key: &[u8], len: usize) -> [usize; 2] {
        // The modulo bias over a u64 is negligible next to the table size.
        self.hashers
            .each_ref()
            .map(|h| (h.hash_one(key) % len as u64) as usize)
    }

    fn refreshed(&self, bucket: Bucket, now: Instant) -> f64 {
        match bucket.at {
            None => self.burst,
            Some(at) => {
                let gained =
                    now.saturating_duration_since(at).as_secs_f64() / self.refill.as_secs_f64();
                (bucket.tokens + gained).min(self.burst)
            }
        }
    }

    /// How long until `key` may try again, or `None` if it may now.
    fn wait(&self, buckets: &[Bucket], key: &[u8], now: Instant) -> Option<Duration> {
        let mut soonest: Option<Duration> = None;
        for slot in self.slots(key, buckets.len()) {
            let tokens = self.refreshed(buckets[slot], now);
            if tokens >= 1.0 {
                return None;
            }
            let wait = self.refill.mul_f64(1.0 - tokens);
            soonest = Some(soonest.map_or(wait, |s| s.min(wait)));
        }
        soonest
    }

    /// Takes (`-1`) or gives back (`+1`) a token in both of `key`'s buckets.
    fn add(&self, buckets: &mut [Bucket], key: &[u8], tokens: f64, now: Instant) {
        for slot in self.slots(key, buckets.len()) {
            let refreshed = self.refreshed(buckets[slot], now);
            buckets[slot] = Bucket {
                tokens: (refreshed + tokens).clamp(0.0, self.burst),
                at: Some(now),
            };
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Vec<Bucket>> {
        self.buckets.lock().unwrap_or_else(|e| e.into_inner())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn limits() -> LoginLimits {
        LoginLimits {
            user_burst: 3,
            user_refill: Duration::from_secs(10),
            address_burst: 5,
            address_refill: Duration::from_secs(2),
            ..LoginLimits::default()
        }
    }

    #[test]
    fn a_user_trips_after_its_burst_and_refills_over_time() {
        let limiter = LoginLimiter::new(&limits());
        let t0 = Instant::now();
        for _ in 0..3 {
            assert_eq!(limiter.attempt("alice", None, t0), Ok(()));
        }
        let refused = limiter.attempt("alice", None, t0).unwrap_err();
        assert_eq!(refused.by, LimitedBy::User);
        assert_eq!(refused.retry_after, Duration::from_secs(10));
        assert_eq!(limiter.attempt("bob", None, t0), Ok(()), "others are not");
        let later = t0 + Duration::from_secs(10);
        assert_eq!(limiter.attempt("alice", None, later), Ok(()));
        assert!(
            limiter.attempt("alice", None, later).is_err(),
            "one at a time"
        );
    }

    #[test]
    fn attempts_in_flight_count_and_successes_give_their_token_back() {
        let limiter = LoginLimiter::new(&limits());
        let t0 = Instant::now();
        let from: IpAddr = "192.0.2.9".parse().unwrap();
        // Started together, none finished: only the burst gets through.
        let admitted = (0..10)
            .filter(|_| limiter.attempt("carol", Some(from), t0).is_ok())
            .count();
        assert_eq!(admitted, 3);
        // Each success gives its token back, to the name and the address.
        limiter.succeeded("carol", Some(from), t0);
        assert_eq!(limiter.attempt("carol", Some(from), t0), Ok(()));
        limiter.succeeded("carol", Some(from), t0);
        limiter.succeeded("carol", Some(from), t0);
        for _ in 0..2 {
            assert_eq!(limiter.attempt("carol", Some(from), t0), Ok(()));
        }
        assert!(limiter.attempt("carol", Some(from), t0).is_err());
    }

    #[test]
    fn an_address_trips_across_user_names() {
        let limiter = LoginLimiter::new(&limits());
        let t0 = Instant::now();
        let attacker: IpAddr = "2001:db8::1".parse().unwrap();
        let neighbour: IpAddr = "2001:db8::2".parse().unwrap();
        let other: IpAddr = "192.0.2.7".parse().unwrap();
        for i in 0..5 {
            limiter
                .attempt(&format!("user{i}"), Some(attacker), t0)
                .unwrap();
        }
        let refused = limiter.attempt("fresh", Some(attacker), t0).unwrap_err();
        assert_eq!(refused.by, LimitedBy::Address);
        assert_eq!(refused.retry_after, Duration::from_secs(2));
        assert!(
            limiter.attempt("fresh", Some(neighbour), t0).is_err(),
            "the same /64"
        );
        assert_eq!(limiter.attempt("fresh", Some(other), t0), Ok(()));
    }

    #[test]
    fn many_names_fill_no_memory_and_lock_out_nobody_else() {
        let limiter = LoginLimiter::new(&LoginLimits {
            tracked: 4096,
            ..limits()
        });
        let t0 = Instant::now();
        for i in 0..300 {
            limiter.attempt(&format!("spray{i}"), None, t0).unwrap();
        }
        assert_eq!(limiter.users.lock().len(), 4096, "fixed memory");
        // One failure each: nobody, sprayed or not, is limited by another's.
        assert_eq!(limiter.attempt("admin", None, t0), Ok(()));
        assert_eq!(limiter.attempt("spray7", None, t0), Ok(()));
    }
}
