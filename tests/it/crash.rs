//! Crash tests (issue 9): the real server SIGKILLed, and the provider
//! SIGKILLed or frozen with SIGSTOP, at random moments of deploying,
//! redeploying and destroying a generated DAG of 100+ processes. After each
//! settle the world must be what Corbel records: every deployment where its
//! last request asked (every call can succeed here, so nothing may fail), and
//! the processes running with the run's mark exactly those its COMPLETE
//! nodes name, each once. At the end everything is destroyed and nothing with
//! the mark may be left. `heal` kills the server while a `restart:` policy
//! restarts a resource (issue 37).
//!
//! Knobs (environment): `CORBEL_CHAOS_SEED` (default: a fixed seed per test;
//! always printed), `CORBEL_CHAOS_KILLS` (faults to inject), and
//! `CORBEL_CHAOS_SOAK=1` to count every violation and fail at the end instead
//! of at the first one. `scripts/soak.sh` runs them long.

mod chaos;
mod followers;
mod heal;
mod invariants;
mod job;
mod moment;
mod observe;
mod partition;
mod replicas;
mod requests;
mod rollback;
mod shape;
mod world;

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::Duration;

use rand::Rng;
use rand::seq::IndexedRandom;

use self::chaos::{Chaos, Knobs, violation};
use self::moment::{Progress, moment};
use self::observe::{Api, identities};
use self::requests::prepare;
use self::world::{Leftovers, world};
use crate::support::binary::{Served, serve};
use crate::support::processes::{provider_process, signal};
use crate::support::provider_repos::{ProviderRepo, process_metadata};
use crate::support::settings::{QUICK_ENV, quick};
use crate::support::{TestApp, TestStore};

/// Deployments of the big blueprint asked to run at once (a few hundred
/// processes).
const MAX_LIVE: usize = 3;

/// The real binary on a store; SIGKILLed on drop if it still runs.
struct Server {
    served: Option<Served>,
}

impl Server {
    fn start(store: &TestStore) -> Server {
        Self::start_with(store, &[])
    }

    /// With more environment on top of [`QUICK_ENV`].
    fn start_with(store: &TestStore, extra: &[(&str, &str)]) -> Server {
        let env: Vec<(&str, &str)> = QUICK_ENV.iter().chain(extra).copied().collect();
        Server {
            served: Some(serve(store, &env)),
        }
    }

    fn api(&self) -> Api {
        let served = self.served.as_ref().expect("running");
        Api::at(served.addr, served.child.id())
    }

    fn kill(&mut self) {
        if let Some(mut served) = self.served.take() {
            served.child.kill().ok();
            served.child.wait().ok();
        }
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        self.kill();
    }
}

/// Each round asks for something (a deploy, a destroy, or a redeploy of one
/// key, chosen by the seed) and SIGKILLs the server when the request has made
/// a random number of steps; now and then it kills the restarted server again
/// while it recovers. Then it restarts it on the same data dir and checks the
/// settled world.
#[tokio::test]
async fn the_server_killed_at_random_moments_converges() {
    let knobs = Knobs::from_env(0x5eed_0009, 10);
    let mut chaos = Chaos::new("the_server_killed_at_random_moments_converges", knobs);
    let _leftovers = Leftovers::new(&chaos.mark);
    let app = TestApp::spawn_with(Arc::new(TestStore::fresh().await), quick).await;
    let repo = ProviderRepo::new(&process_metadata(), &[]);
    let (provider, blueprint) = prepare(&app, &repo, &chaos.shape).await;
    let store = app.stop().await;

    let mut server = Server::start(&store);
    let mut api = server.api();
    let mut views = chaos
        .settle_and_check(&api, &store, &provider, "at the start")
        .await
        .unwrap_or_default();
    for round in 1..=chaos.knobs.kills {
        let when = format!("round {round}");
        // Deployments that did not settle (soak mode) count against the cap,
        // but get no new request until they settle, unless only they are left.
        let (open, live) = (chaos.open(true), chaos.open(false));
        // What runs now: deployments this round does not touch must keep it.
        let running = world(&chaos.mark);
        let bystanders: Vec<(String, String, _)> = live
            .iter()
            .map(|i| &chaos.tracked[*i])
            .filter_map(|t| {
                Some((
                    t.id.clone(),
                    t.name.clone(),
                    identities(views.get(&t.id)?, &running),
                ))
            })
            .collect();
        let roll = chaos.rng.random_range(0..100);
        let mut redeployed = None;
        let (id, progress, what) = if open.len() < MAX_LIVE && (live.is_empty() || roll < 40) {
            let id = chaos.deploy(&api, &blueprint).await;
            (id, Progress::Deploy, "deploy".to_owned())
        } else if roll < 70 || live.is_empty() {
            let pool = if live.is_empty() { &open } else { &live };
            let index = *pool.choose(&mut chaos.rng).expect("a deployment");
            let id = chaos.destroy(&api, index).await;
            let what = format!("destroy {}", chaos.tracked[index].name);
            (id, Progress::Destroy, what)
        } else {
            let index = *live.choose(&mut chaos.rng).expect("a deployment");
            let name = chaos.tracked[index].name.clone();
            match chaos.redeploy(&api, index).await {
                Some(r) => {
                    let what = format!("redeploy {name} [{}], {} nodes", r.key, r.affected.len());
                    let progress = Progress::Redeploy {
                        affected: r.affected.clone(),
                        before: r.before.clone(),
                    };
                    let id = r.id.clone();
                    redeployed = Some(r);
                    (Some(id), progress, what)
                }
                None => (None, Progress::Deploy, format!("redeploy {name}")),
            }
        };
        let steps = progress.steps(chaos.shape.keys.len());
        let target = chaos.rng.random_range(0..=steps);
        let jitter = Duration::from_millis(chaos.rng.random_range(0..25));
        let (at, under_way) = match &id {
            Some(id) => moment(&api, id, &progress, target, jitter).await,
            None => ("the request failed".to_owned(), false),
        };
        server.kill();
        chaos.struck(under_way);
        server = Server::start(&store);
        let mut again = String::new();
        if chaos.rng.random_bool(0.3) {
            let delay = chaos.rng.random_range(0..1500);
            tokio::time::sleep(Duration::from_millis(delay)).await;
            server.kill();
            // Not counted as mid-run: there may have been nothing to recover.
            chaos.struck(false);
            server = Server::start(&store);
            again = format!(", and again {delay} ms into the recovery");
        }
        api = server.api();
        println!("chaos: {when}: {what}; killed at {target}/{steps} steps ({at}){again}");
        let Some(settled) = chaos.settle_and_check(&api, &store, &provider, &when).await else {
            views.clear(); // no bystanders to compare with next round
            continue;
        };
        views = settled;
        let mut found = Vec::new();
        for (other, name, before) in bystanders.iter().filter(|b| Some(&b.0) != id.as_ref()) {
            let what = format!("{name}, untouched by {when}");
            found.extend(chaos.check_replaced(other, &what, before, &BTreeSet::new(), &views));
        }
        if let Some(r) = &redeployed {
            found.extend(chaos.check_redeploy(r, &views));
        }
        chaos.report(&when, found);
    }
    chaos.destroy_everything(&api, &store, &provider).await;
    server.kill();
    chaos.finish();
}

#[derive(Clone, Copy, Debug)]
enum Fault {
    /// SIGKILL: Corbel's supervisor restarts it.
    Kill,
    /// SIGSTOP, and left stopped: Corbel must notice and replace it.
    Freeze,
    /// SIGSTOP, then SIGCONT one to three seconds later.
    FreezeThenThaw,
}

/// The server stays up (in-process); the provider is killed or frozen when a
/// deploy, then a destroy, has made a random number of steps. Faults take
/// turns, so that six rounds try each on a deploy and on a destroy. A
/// resident deployment, made first, must stay untouched by all of it.
#[tokio::test]
async fn the_provider_killed_or_frozen_mid_deploy_converges() {
    let knobs = Knobs::from_env(0x5eed_0109, 6);
    let mut chaos = Chaos::new("the_provider_killed_or_frozen_mid_deploy_converges", knobs);
    let leftovers = Leftovers::new(&chaos.mark);
    let app = TestApp::spawn_with(Arc::new(TestStore::fresh().await), quick).await;
    let repo = ProviderRepo::new(&process_metadata(), &[]);
    let (provider, blueprint) = prepare(&app, &repo, &chaos.shape).await;
    let api = Api::at(app.addr, std::process::id());
    let store = app.store.clone();

    let resident = chaos.deploy(&api, &blueprint).await.expect("a deployment");
    let views = chaos
        .settle_and_check(&api, &store, &provider, "at the start")
        .await
        .unwrap_or_default();
    let untouched = views
        .get(&resident)
        .map(|v| identities(v, &world(&chaos.mark)))
        .unwrap_or_default();
    let mut victim: Option<usize> = None;
    for round in 1..=chaos.knobs.kills {
        let when = format!("round {round}");
        let fault = [Fault::Kill, Fault::Freeze, Fault::FreezeThenThaw][(round - 1) % 3];
        let (id, progress, what) = match victim.take() {
            None => {
                let id = chaos.deploy(&api, &blueprint).await;
                victim = id.as_ref().map(|_| chaos.tracked.len() - 1);
                (id, Progress::Deploy, "deploy")
            }
            Some(index) => (
                chaos.destroy(&api, index).await,
                Progress::Destroy,
                "destroy",
            ),
        };
        let steps = progress.steps(chaos.shape.keys.len());
        let target = chaos.rng.random_range(0..=steps);
        let jitter = Duration::from_millis(chaos.rng.random_range(0..25));
        let (at, under_way) = match &id {
            Some(id) => moment(&api, id, &progress, target, jitter).await,
            None => ("the request failed".to_owned(), false),
        };
        let Some((pid, _)) = provider_process(&store, &provider) else {
            let found = violation("the provider's process", "is not running before a fault");
            chaos.report(&when, vec![found]);
            continue;
        };
        let mut held = String::new();
        match fault {
            Fault::Kill => signal(pid, libc::SIGKILL),
            Fault::Freeze => {
                leftovers.freeze(pid);
            }
            Fault::FreezeThenThaw => {
                if let Some(start) = leftovers.freeze(pid) {
                    let frozen = chaos.rng.random_range(1000..=3000);
                    tokio::time::sleep(Duration::from_millis(frozen)).await;
                    leftovers.thaw(pid, start);
                    held = format!(" for {frozen} ms");
                }
            }
        }
        chaos.struck(under_way);
        println!(
            "chaos: {when}: {what}; provider {pid}: {fault:?}{held} at {target}/{steps} steps ({at})"
        );
        let settled = chaos.settle_and_check(&api, &store, &provider, &when).await;
        if let Some(views) = settled {
            let what = "the resident deployment";
            let found = chaos.check_replaced(&resident, what, &untouched, &BTreeSet::new(), &views);
            chaos.report(&when, found);
        }
    }
    chaos.destroy_everything(&api, &store, &provider).await;
    app.stop().await;
    chaos.finish();
}
