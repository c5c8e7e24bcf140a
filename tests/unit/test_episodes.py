from pipelines.detectors.episodes import Episode, EpisodePolicy


def _run(verdicts, policy):
    episode = Episode()
    return [episode.update(v, policy) for v in verdicts]


def test_warmup_scrapes_are_never_judged():
    fired = _run([True] * 5, EpisodePolicy(warmup=3, persistence=1, rearm=2))
    assert fired == [False, False, False, True, False]


def test_a_score_hovering_around_the_line_pages_once_until_it_stays_calm():
    policy = EpisodePolicy(warmup=0, persistence=2, rearm=3)
    hovering = [True, True, False, True, False, True, True, False, False, False, True, True]
    fired = _run(hovering, policy)
    assert [i for i, f in enumerate(fired) if f] == [1, 11]


def test_episode_round_trips():
    episode = Episode()
    episode.update(True, EpisodePolicy(warmup=0, persistence=1))
    assert Episode.from_dict(episode.to_dict()) == episode
