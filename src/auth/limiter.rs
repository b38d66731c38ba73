//! Login rate limiting, in tables of fixed memory, so that a wrong password
//! slows down whoever sends it and never locks out the right password sent
//! from elsewhere:
//!
//! - **a user name from one address** (the pair): `user_burst` failures in a
//!   row, then a delay that doubles with each further failure (from
//!   `user_refill`, at most [`MAX_DELAY`]); a success, or [`QUIET`] without
//!   a failure, starts it again. One address guessing a name slows down only
//!   itself.
//! - **an address** overall (across names): a token bucket
//!   (`address_burst`, one more per `address_refill`).
//! - **a user name** overall (across addresses): a ceiling of
//!   `user_ceiling` failures (one more per `user_refill`) against guessing
//!   spread over many addresses. Past it, the name is refused from every
//!   address except those it signed in from within [`KNOWN_GOOD`]: a known
//!   good address still gets in, so the ceiling cannot lock out its owner.
//!
//! Each table hashes a key with two process-random keys onto two slots, and
//! a key is limited only when both say so (a count-min sketch: another key
//! sharing one slot cannot lock it out, and without the random keys nobody
//! can aim at both). So a million user names fill no memory, and a name that
//! does not exist is limited like one that does.
//!
//! An attempt takes its token (counts its failure) when it starts
//! ([`LoginLimiter::attempt`], the check and the take under one lock) and a
//! success gives it back ([`LoginLimiter::succeeded`]): the limits trip only
//! on failures, and concurrent guesses cannot all pass the check before any
//! has failed. A refusal is decided before the password is read, so what it
//! says (and its `retry_after`) is the same whatever the password.

use std::collections::hash_map::RandomState;
use std::hash::BuildHasher;
use std::net::IpAddr;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use super::settings::LoginLimits;

/// The longest delay a user name from one address waits.
pub const MAX_DELAY: Duration = Duration::from_secs(15 * 60);
/// A pair without a failure for this long starts again from its burst.
pub const QUIET: Duration = Duration::from_secs(30 * 60);
/// How long a sign-in makes its address known good for the name.
pub const KNOWN_GOOD: Duration = Duration::from_secs(30 * 24 * 3600);

pub struct LoginLimiter {
    pairs: Sketch<Strikes>,
    addresses: Sketch<Bucket>,
    users: Sketch<Bucket>,
    known_good: Sketch<Option<Instant>>,
    limits: LoginLimits,
}

/// Which limit refused a login, and for how long.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Limited {
    pub by: LimitedBy,
    pub retry_after: Duration,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LimitedBy {
    /// This user name from this address.
    UserFromAddress,
    /// This user name from any address it has not signed in from.
    User,
    /// This address, whatever the name.
    Address,
}

impl LoginLimiter {
    pub fn new(limits: &LoginLimits) -> Self {
        let fresh = Bucket {
            tokens: 0.0,
            at: None,
        };
        Self {
            pairs: Sketch::new(limits.tracked, Strikes::default()),
            addresses: Sketch::new(limits.tracked, fresh),
            users: Sketch::new(limits.tracked, fresh),
            known_good: Sketch::new(limits.tracked, None),
            limits: limits.clone(),
        }
    }

    /// Starts an attempt: `Err` when the address, the name from this
    /// address, or the name (from an address not known good) has no attempt
    /// left now; else one is counted against each, to be given back by
    /// [`succeeded`](Self::succeeded) (a failure keeps it).
    pub fn attempt(&self, user: &str, from: Option<IpAddr>, now: Instant) -> Result<(), Limited> {
        let address = from.map(address_key);
        let pair = pair_key(user, address.as_deref());
        // Every table, always in this order, so the check and the take are
        // one step.
        let mut addresses = self.addresses.lock();
        let mut pairs = self.pairs.lock();
        let mut users = self.users.lock();
        let good = self.known_good.lock();
        let l = &self.limits;
        if let Some(key) = &address
            && let Some(retry_after) = self.addresses.wait(&addresses, key, |b| {
                b.wait(l.address_burst, l.address_refill, now)
            })
        {
            return Err(Limited {
                by: LimitedBy::Address,
                retry_after,
            });
        }
        if let Some(retry_after) = self.pairs.wait(&pairs, &pair, |s| s.wait(l, now)) {
            return Err(Limited {
                by: LimitedBy::UserFromAddress,
                retry_after,
            });
        }
        let known_good = self.known_good.all(&good, &pair, |at| {
            at.is_some_and(|at| now.saturating_duration_since(at) < KNOWN_GOOD)
        });
        if !known_good
            && let Some(retry_after) = self.users.wait(&users, user.as_bytes(), |b| {
                b.wait(l.user_ceiling, l.user_refill, now)
            })
        {
            return Err(Limited {
                by: LimitedBy::User,
                retry_after,
            });
        }
        self.pairs.update(&mut pairs, &pair, |s| s.failed(now));
        self.users.update(&mut users, user.as_bytes(), |b| {
            b.add(1.0, l.user_ceiling, l.user_refill, now)
        });
        if let Some(key) = &address {
            self.addresses.update(&mut addresses, key, |b| {
                b.add(1.0, l.address_burst, l.address_refill, now)
            });
        }
        Ok(())
    }

    /// The attempt succeeded: what it took is given back, the name's
    /// failures from this address are forgotten, and the address is known
    /// good for the name.
    pub fn succeeded(&self, user: &str, from: Option<IpAddr>, now: Instant) {
        let address = from.map(address_key);
        let pair = pair_key(user, address.as_deref());
        let l = &self.limits;
        let mut addresses = self.addresses.lock();
        let mut pairs = self.pairs.lock();
        let mut users = self.users.lock();
        let mut good = self.known_good.lock();
        if let Some(key) = &address {
            self.addresses.update(&mut addresses, key, |b| {
                b.add(-1.0, l.address_burst, l.address_refill, now)
            });
        }
        self.pairs
            .update(&mut pairs, &pair, |s| *s = Strikes::default());
        self.users.update(&mut users, user.as_bytes(), |b| {
            b.add(-1.0, l.user_ceiling, l.user_refill, now)
        });
        self.known_good
            .update(&mut good, &pair, |at| *at = Some(now));
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

/// A user name with the address it comes from (none: an unknown address).
fn pair_key(user: &str, address: Option<&[u8]>) -> Vec<u8> {
    let address = address.unwrap_or_default();
    let mut key = Vec::with_capacity(1 + address.len() + user.len());
    // The address's length first: no name can pose as another pair.
    key.push(address.len() as u8);
    key.extend_from_slice(address);
    key.extend_from_slice(user.as_bytes());
    key
}

/// Failures counted against a key, refilled over time (a token bucket of
/// `burst` counted the other way: 0 is a full bucket).
#[derive(Clone, Copy)]
struct Bucket {
    /// Failures counted, as of `at`.
    tokens: f64,
    /// When `tokens` was last brought up to date; `None` for none counted.
    at: Option<Instant>,
}

impl Bucket {
    fn counted(&self, refill: Duration, now: Instant) -> f64 {
        match self.at {
            None => 0.0,
            Some(at) => {
                let forgotten =
                    now.saturating_duration_since(at).as_secs_f64() / refill.as_secs_f64();
                (self.tokens - forgotten).max(0.0)
            }
        }
    }

    /// How long until one more failure may be counted, if not now.
    fn wait(&self, burst: u32, refill: Duration, now: Instant) -> Option<Duration> {
        let over = self.counted(refill, now) - f64::from(burst) + 1.0;
        (over > 0.0).then(|| refill.mul_f64(over))
    }

    fn add(&mut self, n: f64, burst: u32, refill: Duration, now: Instant) {
        *self = Bucket {
            tokens: (self.counted(refill, now) + n).clamp(0.0, f64::from(burst)),
            at: Some(now),
        };
    }
}

/// Failures in a row of a user name from one address.
#[derive(Clone, Copy, Default)]
struct Strikes {
    failures: u32,
    last: Option<Instant>,
}

impl Strikes {
    /// The failures that still count (none after [`QUIET`]).
    fn current(&self, now: Instant) -> u32 {
        match self.last {
            Some(last) if now.saturating_duration_since(last) < QUIET => self.failures,
            _ => 0,
        }
    }

    /// The delay after `failures` in a row: none within the burst, then
    /// the refill doubling with each one more, at most [`MAX_DELAY`].
    fn delay(limits: &LoginLimits, failures: u32) -> Duration {
        match failures.checked_sub(limits.user_burst) {
            None => Duration::ZERO,
            Some(beyond) => limits
                .user_refill
                .saturating_mul(1 << beyond.min(20))
                .min(MAX_DELAY),
        }
    }

    fn wait(&self, limits: &LoginLimits, now: Instant) -> Option<Duration> {
        let failures = self.current(now);
        let last = self.last?;
        let until = last + Self::delay(limits, failures);
        (until > now).then(|| until - now)
    }

    fn failed(&mut self, now: Instant) {
        *self = Strikes {
            failures: self.current(now).saturating_add(1),
            last: Some(now),
        };
    }
}

/// A fixed table of `T`, two slots a key. Its memory is taken at its
/// first use: the four tables of the default size hold 1.4 MB, which a
/// server nobody signs in to need not (over a quarter of its heap at
/// idle).
struct Sketch<T> {
    slots: Mutex<Vec<T>>,
    size: usize,
    empty: T,
    hashers: [RandomState; 2],
}

impl<T: Copy> Sketch<T> {
    fn new(size: usize, empty: T) -> Self {
        Self {
            slots: Mutex::new(Vec::new()),
            size: size.max(1),
            empty,
            hashers: [RandomState::new(), RandomState::new()],
        }
    }

    fn slots(&self, key: &[u8], len: usize) -> [usize; 2] {
        // The modulo bias over a u64 is negligible next to the table size.
        self.hashers
            .each_ref()
            .map(|h| (h.hash_one(key) % len as u64) as usize)
    }

    /// The wait `wait` gives for `key`: limited only when both slots are,
    /// for the shorter of the two.
    fn wait(
        &self,
        slots: &[T],
        key: &[u8],
        wait: impl Fn(&T) -> Option<Duration>,
    ) -> Option<Duration> {
        let mut soonest: Option<Duration> = None;
        for slot in self.slots(key, slots.len()) {
            let wait = wait(&slots[slot])?;
            soonest = Some(soonest.map_or(wait, |s| s.min(wait)));
        }
        soonest
    }

    /// Whether `holds` says so of both of `key`'s slots.
    fn all(&self, slots: &[T], key: &[u8], holds: impl Fn(&T) -> bool) -> bool {
        self.slots(key, slots.len())
            .iter()
            .all(|s| holds(&slots[*s]))
    }

    fn update(&self, slots: &mut [T], key: &[u8], change: impl Fn(&mut T)) {
        for slot in self.slots(key, slots.len()) {
            change(&mut slots[slot]);
        }
    }

    /// The table, every slot there.
    fn lock(&self) -> std::sync::MutexGuard<'_, Vec<T>> {
        let mut slots = self.slots.lock().unwrap_or_else(|e| e.into_inner());
        if slots.is_empty() {
            slots.resize(self.size, self.empty);
        }
        slots
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn limits() -> LoginLimits {
        LoginLimits {
            user_burst: 3,
            user_refill: Duration::from_secs(10),
            user_ceiling: 6,
            address_burst: 5,
            address_refill: Duration::from_secs(2),
            ..LoginLimits::default()
        }
    }

    fn ip(text: &str) -> Option<IpAddr> {
        Some(text.parse().unwrap())
    }

    #[test]
    fn a_name_from_one_address_waits_longer_after_each_failure_past_its_burst() {
        let limiter = LoginLimiter::new(&limits());
        let t0 = Instant::now();
        let from = ip("192.0.2.1");
        for _ in 0..3 {
            assert_eq!(limiter.attempt("alice", from, t0), Ok(()));
        }
        let refused = limiter.attempt("alice", from, t0).unwrap_err();
        assert_eq!(refused.by, LimitedBy::UserFromAddress);
        assert_eq!(refused.retry_after, Duration::from_secs(10));
        // The delay doubles with each failure past the burst.
        let t1 = t0 + Duration::from_secs(10);
        assert_eq!(limiter.attempt("alice", from, t1), Ok(()));
        let refused = limiter.attempt("alice", from, t1).unwrap_err();
        assert_eq!(refused.retry_after, Duration::from_secs(20));
        let t2 = t1 + Duration::from_secs(20);
        assert_eq!(limiter.attempt("alice", from, t2), Ok(()));
        assert_eq!(
            limiter.attempt("alice", from, t2).unwrap_err().retry_after,
            Duration::from_secs(40)
        );
        // Others, and the same name from elsewhere, are not slowed.
        assert_eq!(limiter.attempt("bob", from, t2), Ok(()));
        assert_eq!(limiter.attempt("alice", ip("192.0.2.2"), t2), Ok(()));
        // A quiet while, and it starts again.
        let quiet = t2 + QUIET;
        for _ in 0..3 {
            assert_eq!(limiter.attempt("alice", from, quiet), Ok(()));
        }
    }

    #[test]
    fn the_right_password_from_another_address_gets_in_while_one_address_guesses() {
        let limiter = LoginLimiter::new(&LoginLimits {
            user_ceiling: 100,
            ..limits()
        });
        let attacker = ip("198.51.100.7");
        let owner = ip("203.0.113.5");
        let mut now = Instant::now();
        // One wrong try whenever allowed, for a day: the owner is never refused.
        for _ in 0..200 {
            if limiter.attempt("admin", attacker, now).is_ok() {
                assert_eq!(limiter.attempt("admin", owner, now), Ok(()));
                limiter.succeeded("admin", owner, now);
            }
            now += Duration::from_secs(30);
        }
    }

    #[test]
    fn past_the_ceiling_only_addresses_the_name_signed_in_from_get_in() {
        let limiter = LoginLimiter::new(&limits());
        let t0 = Instant::now();
        let home = ip("203.0.113.1");
        assert_eq!(limiter.attempt("carol", home, t0), Ok(()));
        limiter.succeeded("carol", home, t0);
        // Guesses spread over many addresses reach the name's ceiling.
        for i in 0..6 {
            assert_eq!(
                limiter.attempt("carol", ip(&format!("192.0.2.{i}")), t0),
                Ok(())
            );
        }
        let refused = limiter.attempt("carol", ip("192.0.2.99"), t0).unwrap_err();
        assert_eq!(refused.by, LimitedBy::User);
        assert_eq!(refused.retry_after, Duration::from_secs(10));
        // Home is known good: it still gets in.
        assert_eq!(limiter.attempt("carol", home, t0), Ok(()));
        limiter.succeeded("carol", home, t0);
        // Until it is no longer recent.
        let later = t0 + KNOWN_GOOD + Duration::from_secs(1);
        for i in 0..6 {
            let _ = limiter.attempt("carol", ip(&format!("198.51.100.{i}")), later);
        }
        assert!(limiter.attempt("carol", home, later).is_err());
    }

    #[test]
    fn attempts_in_flight_count_and_successes_give_their_token_back() {
        let limiter = LoginLimiter::new(&limits());
        let t0 = Instant::now();
        let from = ip("192.0.2.9");
        // Started together, none finished: only the burst gets through.
        let admitted = (0..10)
            .filter(|_| limiter.attempt("dave", from, t0).is_ok())
            .count();
        assert_eq!(admitted, 3);
        // A success forgets the name's failures from this address.
        limiter.succeeded("dave", from, t0);
        for _ in 0..3 {
            assert_eq!(limiter.attempt("dave", from, t0), Ok(()));
        }
        assert!(limiter.attempt("dave", from, t0).is_err());
    }

    #[test]
    fn an_address_trips_across_user_names() {
        let limiter = LoginLimiter::new(&limits());
        let t0 = Instant::now();
        let attacker = ip("2001:db8::1");
        for i in 0..5 {
            limiter.attempt(&format!("user{i}"), attacker, t0).unwrap();
        }
        let refused = limiter.attempt("fresh", attacker, t0).unwrap_err();
        assert_eq!(refused.by, LimitedBy::Address);
        assert_eq!(refused.retry_after, Duration::from_secs(2));
        assert!(
            limiter.attempt("fresh", ip("2001:db8::2"), t0).is_err(),
            "the same /64"
        );
        assert_eq!(limiter.attempt("fresh", ip("192.0.2.7"), t0), Ok(()));
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
        assert_eq!(limiter.pairs.lock().len(), 4096, "fixed memory");
        // One failure each: nobody, sprayed or not, is limited by another's.
        assert_eq!(limiter.attempt("admin", None, t0), Ok(()));
        assert_eq!(limiter.attempt("spray7", None, t0), Ok(()));
    }
}
