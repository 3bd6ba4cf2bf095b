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
    use clap::Parser;
    #[derive(Parser)]
    struct T {
        #[command(flatten)]
        a: LoadArgs,
    }
    let t = T::try_parse_from(["t", "--quick"]).unwrap();
    let s = t.a.settings().unwrap();
    assert_eq!((s.duration_s, s.warmup_s, s.retention), (60.0, 20.0, 80));
    let t = T::try_parse_from(["t", "--quick", "--duration", "10s"]).unwrap();
    assert_eq!(t.a.settings().unwrap().duration_s, 10.0);
    let t = T::try_parse_from(["t", "--reconnecting", "40"]).unwrap();
    assert!(t.a.settings().is_err());
    let t = T::try_parse_from(["t", "--min-life", "5s", "--max-life", "1s"]).unwrap();
    assert!(t.a.settings().is_err());
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
