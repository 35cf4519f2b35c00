use super::*;

#[test]
fn windows_cover_parts_overlapping_by_half() {
    let g: Vec<u32> = (0..12).collect();
    let w = windows(&g);
    assert_eq!(w[0], &g[..], "the whole group first");
    // Halves (6, stepping 3), thirds (4, stepping 2), quarters (3, stepping 2).
    assert!(w.contains(&&g[0..6]) && w.contains(&&g[3..9]) && w.contains(&&g[6..12]));
    assert!(w.contains(&&g[8..12]) && w.contains(&&g[2..6]));
    assert!(w.contains(&&g[0..3]) && w.contains(&&g[8..11]) && w.contains(&&g[10..12]));
    for x in &w {
        assert!(!x.is_empty());
    }
    // A single tensor is its only window.
    assert_eq!(windows(&g[..1]), vec![&g[..1]]);
}

#[test]
fn a_window_grows_and_shrinks_at_its_ends() {
    let g: Vec<u32> = (10..16).collect();
    let mut state = State {
        victims: vec![Victim::Policy; 16],
        slack: None,
        held: Vec::new(),
        budget: 1,
    };
    for t in [12, 13] {
        state.victims[t] = Victim::Copy;
    }
    let moves = grown_and_shrunk(&g, &state, Victim::Copy);
    let mut singles: Vec<(u32, Victim)> = moves
        .iter()
        .map(|m| match m {
            Move::Victims(ts, r) if ts.len() == 1 => (ts[0], *r),
            other => panic!("{other:?}"),
        })
        .collect();
    singles.sort_by_key(|x| x.0);
    assert_eq!(
        singles,
        vec![
            (11, Victim::Copy),
            (12, Victim::Policy),
            (13, Victim::Policy),
            (14, Victim::Copy)
        ]
    );
}
