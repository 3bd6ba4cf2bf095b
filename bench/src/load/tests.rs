//! Unit tests of `load`.

use super::*;

#[test]
fn durations() {
    assert!(parse_secs("300").is_err(), "a unit is required");
    assert_eq!(parse_secs("5m"), Ok(300.0));
    assert_eq!(parse_secs("1m 30s"), Ok(90.0));
    assert_eq!(parse_secs("500ms"), Ok(0.5));
    assert_eq!(parse_secs("2s"), Ok(2.0));
    assert!(parse_secs("soon").is_err());
    assert!(parse_secs("3 parsecs").is_err());
    assert!(parse_secs("1000h").is_err());
}

#[test]
fn the_quick_preset_and_checks() {
    let t = |argv: &[&str]| crate::cluster::parse::<LoadArgs>(argv).settings();
    let s = t(&["--quick"]).unwrap();
    assert_eq!((s.duration_s, s.warmup_s, s.retention), (60.0, 20.0, 80));
    assert_eq!(
        t(&["--quick", "--duration", "10s"]).unwrap().duration_s,
        10.0
    );
    assert!(t(&["--reconnecting", "40"]).is_err());
    assert!(t(&["--min-life", "5s", "--max-life", "1s"]).is_err());
}

#[test]
fn random_lives_stay_in_range() {
    let mut r = Rng::new(7);
    for _ in 0..1000 {
        let v = r.range(2.0, 10.0);
        assert!((2.0..=10.0).contains(&v));
    }
    assert_ne!(Rng::new(1).next(), Rng::new(2).next());
}
