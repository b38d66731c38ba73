use super::*;
use proptest::prelude::{Just, ProptestConfig, prop, prop_assert, prop_assert_eq, proptest};
use proptest::strategy::Strategy as _;

fn node(name: &str, capacity: i64, count: i64) -> NodeInput {
    NodeInput::new(name, capacity, count)
}

/// eru's `deployedNodes()` fixture: capacity 10 each, counts 2, 3, 5, 7.
fn deployed_nodes() -> Vec<NodeInput> {
    vec![
        node("n1", 10, 2),
        node("n2", 10, 3),
        node("n3", 10, 5),
        node("n4", 10, 7),
    ]
}

/// eru's `genNodesByCapCount`: nodes named "0", "1", ... .
fn by_cap_count(caps: &[i64], counts: &[i64]) -> Vec<NodeInput> {
    caps.iter()
        .zip(counts)
        .enumerate()
        .map(|(i, (&cap, &count))| node(&i.to_string(), cap, count))
        .collect()
}

/// Final per-node counts, sorted, as eru's `getFinalStatus` + `ElementsMatch`.
fn final_counts(plan: &Plan, nodes: &[NodeInput]) -> Vec<i64> {
    let mut out: Vec<i64> = nodes.iter().map(|n| n.count + plan.get(&n.name)).collect();
    out.sort_unstable();
    out
}

fn is_not_enough(result: &Result<Plan, StrategyError>) -> bool {
    matches!(result, Err(StrategyError::NotEnoughCapacity { .. }))
}

#[test]
fn names_round_trip() {
    for s in Strategy::ALL {
        assert_eq!(s.as_str().parse::<Strategy>(), Ok(s));
        assert_eq!(s.to_string(), s.as_str());
    }
    assert!("auto".parse::<Strategy>().is_err());
    assert!("DUMMY".parse::<Strategy>().is_err());
}

#[test]
fn auto_matches_eru_communism_examples() {
    let nodes = deployed_nodes();
    let cases: [(i64, [i64; 4]); 6] = [
        (1, [3, 3, 5, 7]),
        (2, [3, 4, 5, 7]),
        (3, [4, 4, 5, 7]),
        (4, [4, 5, 5, 7]),
        (29, [11, 11, 12, 12]),
        (37, [12, 13, 14, 15]),
    ];
    for (need, want) in cases {
        let plan = plan(Strategy::Auto, &nodes, need).expect("fits");
        assert_eq!(final_counts(&plan, &nodes), want, "need {need}");
        assert_eq!(plan.total, need);
    }
    // Two nodes tie at count 3 after the first replica; n2 has more room left.
    assert_eq!(plan(Strategy::Auto, &nodes, 2).expect("fits").get("n2"), 1);
    let err = plan(Strategy::Auto, &nodes, 41).expect_err("only 40 fit");
    assert_eq!(
        err,
        StrategyError::NotEnoughCapacity {
            strategy: Strategy::Auto,
            need: 41,
            available: 40,
            short_node: None,
        }
    );
    assert_eq!(
        err.to_string(),
        "AUTO placement needs room for 41 more replicas, but the nodes have room for only 40"
    );
}

#[test]
fn fill_matches_eru_examples() {
    let nodes = deployed_nodes();
    let plan10 = plan(Strategy::Fill, &nodes, 10).expect("fits");
    assert_eq!(final_counts(&plan10, &nodes), [10, 10, 10, 10]);
    assert_eq!(plan10.total, 8 + 7 + 5 + 3);
    let plan5 = plan(Strategy::Fill, &nodes, 5).expect("fits");
    assert_eq!(final_counts(&plan5, &nodes), [5, 5, 5, 7]);
    // n1 (2 + 10) and n2 (3 + 10) cannot reach 15: the plan fails, nothing is skipped.
    let err = plan(Strategy::Fill, &nodes, 15).expect_err("n1, n2 short");
    assert_eq!(
        err,
        StrategyError::NotEnoughCapacity {
            strategy: Strategy::Fill,
            need: 13 + 12 + 10 + 8,
            available: 10 + 10 + 10 + 8,
            short_node: Some("n1".into()),
        }
    );
    assert!(err.to_string().contains("node `n1` is short of room"));
    // eru: ErrAlreadyFilled; here an empty plan.
    assert_eq!(plan(Strategy::Fill, &nodes, 1), Ok(Plan::default()));
    // eru's "65"/"67" case: a node with no room and a deficit fails the plan.
    let nodes = [node("65", 0, 0), node("67", 10, 0)];
    assert!(is_not_enough(&plan(Strategy::Fill, &nodes, 1)));
    let nodes = by_cap_count(&[1, 2, 3, 4, 5], &[3, 3, 3, 3, 3]);
    let plan4 = plan(Strategy::Fill, &nodes, 4).expect("fits");
    assert_eq!(final_counts(&plan4, &nodes), [4, 4, 4, 4, 4]);
    assert!(is_not_enough(&plan(Strategy::Fill, &nodes, 5)));
}

#[test]
fn each_matches_eru_average_examples() {
    let nodes = deployed_nodes();
    let one = plan(Strategy::Each, &nodes, 1).expect("fits");
    assert_eq!(one.placements.len(), 4);
    assert!(one.placements.iter().all(|(_, n)| *n == 1));
    assert_eq!(plan(Strategy::Each, &nodes, 10).expect("fits").total, 40);
    let err = plan(Strategy::Each, &nodes, 100).expect_err("no room");
    assert_eq!(
        err.to_string(),
        "EACH placement needs room for 400 more replicas, but the nodes have room for only 40 \
         (node `n1` is short of room for its share)"
    );
    let with_full = [node("a", 5, 0), node("b", 0, 0)];
    assert!(is_not_enough(&plan(Strategy::Each, &with_full, 1)));
}

#[test]
fn global_matches_eru_examples() {
    let n1 = NodeInput::new("n1", 1, 0).with_usage(0.8, 0.05);
    let n2 = NodeInput::new("n2", 1, 0).with_usage(0.5, 0.11);
    let n3 = NodeInput::new("n3", 1, 0).with_usage(2.2, 0.05);
    let p = plan(Strategy::Global, &[n3, n2, n1], 3).expect("fits");
    assert_eq!(
        p.placements,
        [("n1".into(), 1), ("n2".into(), 1), ("n3".into(), 1)]
    );

    // n2 after two replicas (0.72) is still below n1 after one (1.65).
    let n1 = NodeInput::new("n1", 100, 0).with_usage(1.6, 0.05);
    let n2 = NodeInput::new("n2", 100, 0).with_usage(0.5, 0.11);
    assert_eq!(
        plan(Strategy::Global, &[n2, n1], 2)
            .expect("fits")
            .get("n2"),
        2
    );

    let n1 = NodeInput::new("n1", 100, 0).with_usage(0.5259232954545454, 0.0000712);
    assert_eq!(plan(Strategy::Global, &[n1], 1).expect("fits").get("n1"), 1);

    let n1 = NodeInput::new("n1", 100, 21).with_usage(0.3, 0.2);
    assert_eq!(
        plan(Strategy::Global, &[n1], 10).expect("fits").get("n1"),
        10
    );
}

#[test]
fn global_interleaves_by_usage_after_placement() {
    // a: 0.2, 0.4, 0.6, ...  b: 0.35, 0.4, 0.45, ...  The five lowest keys are
    // 0.2 a, 0.35 b, then 0.4 for both (each would have 2 replicas: a by name), 0.45 b.
    let a = NodeInput::new("a", 10, 0).with_usage(0.0, 0.2);
    let b = NodeInput::new("b", 10, 0).with_usage(0.3, 0.05);
    let p = plan(Strategy::Global, &[b.clone(), a.clone()], 5).expect("fits");
    assert_eq!(p.get("a"), 2);
    assert_eq!(p.get("b"), 3);
    let p = plan(Strategy::Global, &[a, b], 3).expect("fits");
    assert_eq!((p.get("a"), p.get("b")), (2, 1));
    // Rate 0 everywhere: equal usage spreads by count, like AUTO.
    let flat: Vec<NodeInput> = (0..3).map(|i| node(&format!("f{i}"), 10, i)).collect();
    let p = plan(Strategy::Global, &flat, 6).expect("fits");
    assert_eq!(final_counts(&p, &flat), [3, 3, 3]);
}

#[test]
fn drained_matches_eru_examples() {
    let nodes = by_cap_count(&[10, 9, 10, 8], &[2, 3, 5, 7]);
    let cases: [(i64, [i64; 4]); 7] = [
        (1, [2, 3, 5, 8]),
        (2, [2, 3, 5, 9]),
        (3, [2, 3, 5, 10]),
        (10, [2, 5, 5, 15]),
        (25, [5, 10, 12, 15]),
        (29, [7, 12, 12, 15]),
        (37, [12, 12, 15, 15]),
    ];
    for (need, want) in cases {
        let p = plan(Strategy::Drained, &nodes, need).expect("fits");
        assert_eq!(final_counts(&p, &nodes), want, "need {need}");
    }
    let err = plan(Strategy::Drained, &nodes, 38).expect_err("only 37 fit");
    assert!(
        err.to_string()
            .starts_with("DRAINED placement needs room for 38")
    );
    let nodes = [
        node("small-idle", 5, 0).with_usage(0.1, 0.0),
        node("big-busy", 10, 0).with_usage(0.9, 0.0),
    ];
    let p = plan(Strategy::Drained, &nodes, 5).expect("fits");
    assert_eq!(p.placements, [("small-idle".into(), 5)]);
    // Equal capacity: the busier node drains first.
    let nodes = [
        node("a", 5, 0).with_usage(0.1, 0.0),
        node("b", 5, 0).with_usage(0.9, 0.0),
    ];
    assert_eq!(
        plan(Strategy::Drained, &nodes, 6).expect("fits").get("b"),
        5
    );
}

#[test]
fn invalid_inputs_are_rejected() {
    let ok = node("a", 1, 0);
    let cases = [
        (vec![node("a", -1, 0)], "capacity -1 is negative"),
        (vec![node("a", 1, -1)], "replica count -1 is negative"),
        (vec![ok.clone().with_usage(f64::NAN, 0.0)], "usage NaN"),
        (vec![ok.clone().with_usage(0.0, f64::INFINITY)], "rate inf"),
        (vec![ok.clone().with_usage(-0.5, 0.0)], "usage -0.5"),
        (vec![ok.clone(), node("a", 2, 0)], "more than once"),
        (vec![node("", 1, 0)], "name is empty"),
    ];
    for strategy in Strategy::ALL {
        for (nodes, reason) in &cases {
            let err = plan(strategy, nodes, 1).expect_err("invalid");
            assert!(
                matches!(&err, StrategyError::InvalidInput { .. })
                    && err.to_string().contains(reason),
                "{strategy}: {err}"
            );
        }
        assert_eq!(
            plan(strategy, &[], 1),
            Err(StrategyError::NoNodes { strategy })
        );
        assert!(matches!(
            plan(strategy, std::slice::from_ref(&ok), -1),
            Err(StrategyError::InvalidNeed { need: -1, .. })
        ));
        assert_eq!(
            plan(strategy, std::slice::from_ref(&ok), 0),
            Ok(Plan::default())
        );
    }
}

#[test]
fn huge_numbers_neither_overflow_nor_loop() {
    let big = [
        node("a", i64::MAX, i64::MAX).with_usage(1e300, 1e300),
        node("b", i64::MAX, 0).with_usage(0.0, 1e-12),
        node("c", i64::MAX - 1, 7).with_usage(0.5, 0.25),
    ];
    for strategy in [Strategy::Auto, Strategy::Global, Strategy::Drained] {
        let p = plan(strategy, &big, i64::MAX).expect("fits");
        assert_eq!(p.total, i64::MAX, "{strategy}");
    }
    // EACH and FILL totals beyond i64 are refused, not wrapped.
    assert!(matches!(
        plan(Strategy::Each, &big[..2], i64::MAX),
        Err(StrategyError::InvalidNeed { .. })
    ));
    assert!(matches!(
        plan(Strategy::Fill, &big[1..], i64::MAX),
        Err(StrategyError::InvalidNeed { .. })
    ));
    let p = plan(
        Strategy::Fill,
        &[big[0].clone(), big[2].clone()],
        i64::MAX - 7,
    );
    assert_eq!(
        p.map(|p| p.placements),
        Ok(vec![("c".into(), i64::MAX - 14)])
    );
    // Shortfalls beyond i64 are reported saturated.
    let err = plan(Strategy::Each, &big, i64::MAX).expect_err("c is short");
    assert_eq!(
        err,
        StrategyError::NotEnoughCapacity {
            strategy: Strategy::Each,
            need: i64::MAX,
            available: i64::MAX,
            short_node: Some("c".into()),
        }
    );
}

#[test]
fn raw_capacity_lists_every_node_by_name() {
    let nodes = [node("b", 3, 1), node("a", 0, 9), node("c", -4, 0)];
    assert_eq!(
        raw_capacity(&nodes),
        [("a".into(), 0), ("b".into(), 3), ("c".into(), 0)]
    );
}

// ---- properties -------------------------------------------------------------

/// The literal greedy loops from the reference, one replica at a time with a linear
/// scan, over the same quantised usage: the oracle for AUTO and GLOBAL.
fn greedy(strategy: Strategy, nodes: &[NodeInput], need: i64) -> Option<Vec<(String, i64)>> {
    let mut sorted: Vec<&NodeInput> = nodes.iter().collect();
    sorted.sort_by(|a, b| a.name.cmp(&b.name));
    let mut placed = vec![0i64; sorted.len()];
    for _ in 0..need {
        let best = (0..sorted.len())
            .filter(|&i| placed[i] < sorted[i].capacity)
            .min_by_key(|&i| {
                let n = sorted[i];
                let count = n.count + placed[i];
                let key = quantize(n.usage) + i128::from(placed[i] + 1) * quantize(n.rate);
                match strategy {
                    Strategy::Auto => (0, count, Reverse(n.capacity - placed[i]), i),
                    _ => (key, count + 1, Reverse(0), i),
                }
            })?;
        placed[best] += 1;
    }
    Some(
        sorted
            .iter()
            .zip(placed)
            .filter(|(_, p)| *p > 0)
            .map(|(n, p)| (n.name.clone(), p))
            .collect(),
    )
}

fn arb_nodes() -> impl proptest::strategy::Strategy<Value = Vec<NodeInput>> {
    prop::collection::vec((0i64..=12, 0i64..=12, 0u32..=20, 0u32..=6), 1..=8).prop_map(|v| {
        v.into_iter()
            .enumerate()
            .map(|(i, (cap, count, usage, rate))| {
                // Coarse usage and rate values so GLOBAL ties are common.
                NodeInput::new(format!("node-{:02}", (i * 7) % 11), cap, count)
                    .with_usage(f64::from(usage) / 20.0, f64::from(rate) / 20.0)
            })
            .collect()
    })
}

/// Nodes, the same nodes shuffled, and a replica count around their total capacity.
fn arb_case() -> impl proptest::strategy::Strategy<Value = (Vec<NodeInput>, Vec<NodeInput>, i64)> {
    arb_nodes().prop_flat_map(|nodes| {
        let total: i64 = nodes.iter().map(|n| n.capacity).sum();
        (
            Just(nodes.clone()),
            Just(nodes).prop_shuffle(),
            0..=total + 3,
        )
    })
}

fn check_shape(p: &Plan, nodes: &[NodeInput]) -> Result<(), String> {
    let names: Vec<&str> = p.placements.iter().map(|(n, _)| n.as_str()).collect();
    if !names.windows(2).all(|w| w[0] < w[1]) {
        return Err(format!("placements not sorted by name: {names:?}"));
    }
    for (name, n) in &p.placements {
        let node = nodes
            .iter()
            .find(|x| &x.name == name)
            .ok_or("unknown node")?;
        if *n <= 0 || *n > node.capacity {
            return Err(format!("{name}: {n} outside 1..={}", node.capacity));
        }
    }
    if p.placements.iter().map(|(_, n)| n).sum::<i64>() != p.total {
        return Err("total is not the sum".into());
    }
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    #[test]
    fn every_plan_is_deterministic_and_within_capacity((nodes, shuffled, need) in arb_case()) {
        for strategy in Strategy::ALL {
            let got = plan(strategy, &nodes, need);
            prop_assert_eq!(&got, &plan(strategy, &nodes, need));
            prop_assert_eq!(&got, &plan(strategy, &shuffled, need), "{} depends on input order", strategy);
            if let Ok(p) = &got {
                let shape = check_shape(p, &nodes);
                prop_assert!(shape.is_ok(), "{}: {:?}", strategy, shape);
            }
        }
    }

    #[test]
    fn pooled_strategies_place_exactly_need((nodes, _s, need) in arb_case()) {
        let total: i64 = nodes.iter().map(|n| n.capacity).sum();
        for strategy in [Strategy::Auto, Strategy::Global, Strategy::Drained] {
            let got = plan(strategy, &nodes, need);
            if need <= total {
                prop_assert_eq!(got.map(|p| p.total), Ok(need), "{}", strategy);
            } else {
                prop_assert!(is_not_enough(&got), "{}: {:?}", strategy, got);
            }
        }
    }

    #[test]
    fn auto_and_global_equal_the_greedy_loop((nodes, _s, need) in arb_case()) {
        for strategy in [Strategy::Auto, Strategy::Global] {
            let got = plan(strategy, &nodes, need).ok().map(|p| p.placements);
            prop_assert_eq!(got, greedy(strategy, &nodes, need), "{}", strategy);
        }
    }

    #[test]
    fn auto_is_as_even_as_capacity_allows((nodes, _s, need) in arb_case()) {
        if let Ok(p) = plan(Strategy::Auto, &nodes, need) {
            // No node was given a replica that left it more than one above a node
            // that still had room.
            for given in nodes.iter().filter(|n| p.get(&n.name) > 0) {
                let top = given.count + p.get(&given.name);
                for open in nodes.iter().filter(|n| p.get(&n.name) < n.capacity) {
                    prop_assert!(top <= open.count + p.get(&open.name) + 1,
                        "{} ends at {}, {} could take more at {}",
                        given.name, top, open.name, open.count + p.get(&open.name));
                }
            }
        }
    }

    #[test]
    fn fill_tops_up_to_target_or_fails((nodes, _s, _n) in arb_case(), target in 0i64..=15) {
        let got = plan(Strategy::Fill, &nodes, target);
        let fits = nodes.iter().all(|n| (target - n.count).max(0) <= n.capacity);
        if fits {
            let p = got.map_err(|e| e.to_string());
            prop_assert!(p.is_ok(), "{:?}", p);
            let p = p.unwrap_or_default();
            for n in &nodes {
                prop_assert_eq!(p.get(&n.name), (target - n.count).max(0));
            }
        } else {
            prop_assert!(target > 0 && is_not_enough(&got), "{:?}", got);
        }
    }

    #[test]
    fn each_adds_n_everywhere_or_fails((nodes, _s, _n) in arb_case(), per_node in 0i64..=15) {
        let got = plan(Strategy::Each, &nodes, per_node);
        if nodes.iter().all(|n| n.capacity >= per_node) {
            let want = per_node * i64::try_from(nodes.len()).unwrap_or(0);
            prop_assert_eq!(got.map(|p| p.total), Ok(want));
        } else {
            prop_assert!(is_not_enough(&got), "{:?}", got);
        }
    }

    #[test]
    fn drained_fills_smallest_capacity_first((nodes, _s, need) in arb_case()) {
        if let Ok(p) = plan(Strategy::Drained, &nodes, need) {
            // A node given less than its capacity means every node after it in the
            // drain order got nothing and every node before it is full.
            let mut order: Vec<&NodeInput> = nodes.iter().collect();
            order.sort_by(|a, b| a.capacity.cmp(&b.capacity)
                .then(b.usage.total_cmp(&a.usage)).then(a.name.cmp(&b.name)));
            let given: Vec<i64> = order.iter().map(|n| p.get(&n.name)).collect();
            let full = order.iter().zip(&given).take_while(|(n, g)| **g == n.capacity).count();
            prop_assert!(given[full..].iter().skip(1).all(|g| *g == 0), "{:?}", given);
        }
    }
}
