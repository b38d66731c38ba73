//! The generated blueprint the crash tests deploy.

use std::collections::{BTreeMap, BTreeSet};

use rand::Rng;
use rand::rngs::StdRng;

/// A blueprint of 100–110 `process.v1.service` resources (each a `sleep`): a
/// hub with many dependents (fan-out), three chains of 8–12 hanging from it,
/// random edges to anything earlier, and a sink that needs many (fan-in).
/// Every chain edge, and about half the others, passes the dependency's pid
/// through a template: a resource started before its dependency is complete
/// fails visibly. Each process carries the run's mark, its key and its
/// deployment's name (the `tag` variable) in its environment.
pub struct Shape {
    /// In a topological order.
    pub keys: Vec<String>,
    pub depends_on: BTreeMap<String, Vec<String>>,
    pub source: String,
}

impl Shape {
    pub fn generate(rng: &mut StdRng, mark: &str) -> Shape {
        let total = rng.random_range(100..=110);
        // (key, dependencies, how many of them go through a template)
        let mut order: Vec<(String, Vec<String>, usize)> = vec![("hub".into(), Vec::new(), 0)];
        for chain in 0..3 {
            let mut previous = "hub".to_owned();
            for link in 0..rng.random_range(8..=12) {
                let key = format!("c{chain}_{link}");
                order.push((key.clone(), vec![previous], 1));
                previous = key;
            }
        }
        for i in 0..rng.random_range(12..=20) {
            let templated = usize::from(rng.random_bool(0.5));
            order.push((format!("f{i}"), vec!["hub".into()], templated));
        }
        let mut i = 0;
        while order.len() < total - 1 {
            let count = rng.random_range(0..=3);
            let deps = pick(rng, &order, count);
            let templated = rng.random_range(0..=deps.len());
            order.push((format!("m{i}"), deps, templated));
            i += 1;
        }
        let count = rng.random_range(16..=24);
        let deps = pick(rng, &order, count);
        order.push(("sink".into(), deps, 4));

        let mut source = String::from(
            "version: \"1\"\nvariables:\n  tag: { type: string, default: \"\" }\nresources:\n",
        );
        for (key, deps, templated) in &order {
            source.push_str(&format!("  {key}:\n    type: process.v1.service\n"));
            if !deps.is_empty() {
                source.push_str(&format!("    depends_on: [{}]\n", deps.join(", ")));
            }
            source.push_str(&format!(
                "    config:\n      command: sleep\n      args: [\"3600\"]\n      env:\n        CHAOS_MARK: \"{mark}\"\n        CHAOS_KEY: \"{key}\"\n        CHAOS_TAG: \"{{{{ tag }}}}\"\n"
            ));
            for dep in deps.iter().take(*templated) {
                source.push_str(&format!(
                    "        DEP_{dep}: \"{{{{ resources.{dep}.outputs.pid }}}}\"\n"
                ));
            }
        }
        Shape {
            keys: order.iter().map(|(k, _, _)| k.clone()).collect(),
            depends_on: order.into_iter().map(|(k, d, _)| (k, d)).collect(),
            source,
        }
    }

    /// `key` and everything that depends on it, directly or not.
    pub fn with_dependents(&self, key: &str) -> BTreeSet<String> {
        let mut found = BTreeSet::from([key.to_owned()]);
        for k in &self.keys {
            if self.depends_on[k].iter().any(|d| found.contains(d)) {
                found.insert(k.clone());
            }
        }
        found
    }

    /// Keys something depends on.
    pub fn inner_keys(&self) -> Vec<&String> {
        let needed: BTreeSet<&String> = self.depends_on.values().flatten().collect();
        self.keys.iter().filter(|k| needed.contains(k)).collect()
    }

    /// The longest chain of dependencies, in resources.
    pub fn depth(&self) -> usize {
        let mut depth: BTreeMap<&str, usize> = BTreeMap::new();
        for k in &self.keys {
            let d = 1 + self.depends_on[k]
                .iter()
                .map(|d| depth[d.as_str()])
                .max()
                .unwrap_or(0);
            depth.insert(k, d);
        }
        depth.values().copied().max().unwrap_or(0)
    }

    /// One line for the log.
    pub fn describe(&self) -> String {
        let fan_out = self
            .keys
            .iter()
            .map(|k| self.depends_on.values().filter(|d| d.contains(k)).count())
            .max()
            .unwrap_or(0);
        let fan_in = self.depends_on.values().map(Vec::len).max().unwrap_or(0);
        format!(
            "{} resources, {} edges, depth {}, fan-out {fan_out}, fan-in {fan_in}",
            self.keys.len(),
            self.depends_on.values().map(Vec::len).sum::<usize>(),
            self.depth()
        )
    }
}

/// Up to `count` distinct keys among those generated so far.
fn pick(rng: &mut StdRng, order: &[(String, Vec<String>, usize)], count: usize) -> Vec<String> {
    let mut chosen: Vec<String> =
        rand::seq::index::sample(rng, order.len(), count.min(order.len()))
            .into_iter()
            .map(|i| order[i].0.clone())
            .collect();
    chosen.sort();
    chosen
}

#[test]
fn the_generated_blueprint_has_the_shape_the_crash_tests_need() {
    use rand::SeedableRng;
    for seed in 0..20 {
        let shape = Shape::generate(&mut StdRng::seed_from_u64(seed), "m");
        let bp = corbel::deploy::blueprint::parse(&shape.source)
            .unwrap_or_else(|p| panic!("seed {seed}: {p}\n{}", shape.source));
        let problems = corbel::deploy::blueprint::check(&bp);
        assert!(problems.is_empty(), "seed {seed}: {problems:?}");
        assert_eq!(bp.resources.len(), shape.keys.len());
        assert!(shape.keys.len() >= 100, "seed {seed}: {}", shape.describe());
        assert!(shape.depth() >= 8, "seed {seed}: {}", shape.describe());
        assert!(shape.depends_on["sink"].len() >= 16, "fan-in");
        let hub_dependents = shape
            .depends_on
            .values()
            .filter(|d| d.contains(&"hub".to_owned()));
        assert!(hub_dependents.count() >= 15, "fan-out");
        assert!(
            shape.source.matches("outputs.pid").count() >= 30,
            "templates"
        );
    }
}
