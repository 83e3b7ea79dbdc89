"""The env registry: names, frameskips, gymnasium ids, errors for unknown names."""
import sys

import numpy as np
import pytest
from fastrl.envs.doom.actions import TURN_ANGLES, ActionMapper
from fastrl.envs.doom.scenarios import SCENARIOS
from fastrl.envs.registry import EnvSpec, UnknownEnvError, get_spec, known_env_names

DOOM_NAMES = ["doom_battle", "doom_deathmatch", "doom_duel", "doom_basic", "doom_defend_the_center",
              "doom_defend_the_line", "doom_health_gathering_supreme", "doom_deadly_corridor", "doom_my_way_home",
              "doom_custom"]


def test_gymnasium_id_makes_a_seeded_env_and_ignores_doom_options():
    spec = get_spec("CartPole-v1")
    assert isinstance(spec, EnvSpec) and spec.name == "CartPole-v1" and spec.frameskip == 1
    env = spec.make(seed=3, doom_measurements=True, doom_scenario="/nowhere.cfg")
    obs, _ = env.reset()
    assert env.observation_space.contains(obs)
    obs2, reward, terminated, truncated, info = env.step(env.action_space.sample())
    assert env.observation_space.contains(obs2) and reward == 1.0
    env.close()
    # Seeding at make: two envs made with one seed start the same.
    a, b = spec.make(seed=5), spec.make(seed=5)
    np.testing.assert_array_equal(a.reset()[0], b.reset()[0])


def test_gymnasium_render_mode_is_passed_through():
    env = get_spec("CartPole-v1").make(seed=0, render_mode="rgb_array")
    env.reset()
    frame = env.render()
    assert frame.ndim == 3 and frame.shape[2] == 3
    env.close()


def test_every_doom_name_is_known_with_frameskip_4():
    names = known_env_names()
    assert names[:len(SCENARIOS)] == list(SCENARIOS)
    assert set(DOOM_NAMES) == set(SCENARIOS)
    assert "CartPole-v1" in names
    for name in DOOM_NAMES:
        spec = get_spec(name)  # must not start an engine
        assert spec.name == name and spec.frameskip == 4 and spec.description


@pytest.mark.parametrize("typo, expected", [
    ("doom_batle", "doom_battle"),
    ("doom-basic", "doom_basic"),
    ("CartPol-v1", "CartPole-v1"),
    ("DOOM_DEATHMATCH", "doom_deathmatch"),
])
def test_unknown_name_suggests_the_closest(typo, expected):
    with pytest.raises(UnknownEnvError) as err:
        get_spec(typo)
    message = str(err.value)
    assert isinstance(err.value, ValueError)
    assert f"did you mean {expected!r}?" in message
    assert "\n" not in message and message.count("?") == 1


def test_unknown_name_without_a_close_match_is_one_sentence():
    with pytest.raises(UnknownEnvError) as err:
        get_spec("zzzzqqqq")
    message = str(err.value)
    assert "\n" not in message and message.endswith(".") and "doom_battle" in message


@pytest.mark.parametrize("source, words", [
    (None, "module 'fastrl_test_envmod' cannot be imported (No module named 'fastrl_test_envmod'); put its folder"),
    ("import no_such_dependency_xyz\n", "failed to import (ModuleNotFoundError: No module named "
                                         "'no_such_dependency_xyz'); install what it needs"),
    ("raise RuntimeError('boom\\nsecond line')\n", "failed to import (RuntimeError: boom); fix that module"),
    ("x = (\n", "failed to import (SyntaxError: "),
])
def test_a_module_env_that_cannot_be_imported_is_one_sentence(tmp_path, monkeypatch, source, words):
    """An env given as module:Id whose module is missing, needs a missing package, or
    fails on import: the user learns which, in one line, whatever the module raised."""
    if source is not None:
        (tmp_path / "fastrl_test_envmod.py").write_text(source)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, "fastrl_test_envmod", raising=False)
    with pytest.raises(UnknownEnvError) as err:
        get_spec("fastrl_test_envmod:Mine-v0")
    assert words in str(err.value) and "\n" not in str(err.value)


# -- the action mapping (no engine needed) ------------------------------------------------

BATTLE_BUTTONS = ["MOVE_FORWARD", "MOVE_BACKWARD", "MOVE_LEFT", "MOVE_RIGHT", "ATTACK", "SPEED",
                  "TURN_LEFT_RIGHT_DELTA"]


def test_battle_buttons_give_the_five_heads():
    m = ActionMapper(BATTLE_BUTTONS, frameskip=4)
    assert [h.name for h in m.heads] == ["move", "strafe", "attack", "sprint", "turn"]
    assert m.nvec.tolist() == [3, 3, 2, 2, 11]
    assert len(TURN_ANGLES) == 11 and TURN_ANGLES[0] == -20 and TURN_ANGLES[-1] == 20
    assert m([0, 0, 0, 0, 5]) == [0.0] * 7  # all "none", turn 0
    # forward, strafe right, attack, sprint, hardest right turn: 20 degrees over 4 tics
    assert m([1, 2, 1, 1, 10]) == [1.0, 0.0, 0.0, 1.0, 1.0, 1.0, 5.0]
    assert m(np.array([2, 1, 0, 0, 0])) == [0.0, 1.0, 1.0, 0.0, 0.0, 0.0, -5.0]


def test_small_scenarios_and_leftover_buttons():
    basic = ActionMapper(["MOVE_LEFT", "MOVE_RIGHT", "ATTACK"], frameskip=4)
    assert [h.name for h in basic.heads] == ["strafe", "attack"] and basic.nvec.tolist() == [3, 2]
    assert basic([2, 1]) == [0.0, 1.0, 1.0]
    # Delta turn wins over TURN_LEFT/RIGHT (left unpressed); other buttons get their own heads.
    mixed = ActionMapper(["TURN_LEFT", "TURN_RIGHT", "ATTACK", "USE", "TURN_LEFT_RIGHT_DELTA",
                          "SELECT_WEAPON2", "LOOK_UP_DOWN_DELTA"], frameskip=4)
    assert [h.name for h in mixed.heads] == ["attack", "turn", "look", "use", "select_weapon2"]
    assert mixed([0, 0, 0, 1, 1]) == [0.0, 0.0, 0.0, 1.0, -5.0, 1.0, 0.0]


def test_bad_actions_are_refused():
    m = ActionMapper(BATTLE_BUTTONS, frameskip=4)
    for bad in ([0, 0, 0, 0], [0, 0, 0, 0, 11], [0, -1, 0, 0, 0]):
        with pytest.raises(ValueError):
            m(bad)
    with pytest.raises(ValueError):
        ActionMapper([], frameskip=4)
