"""The Doom scenarios fastrl knows, in one table, importable without vizdoom so the
registry can validate names anywhere. Maps and classic configs are ViZDoom's own
(found at run time); doom_battle's and the deathmatch configs are fastrl's
(envs/doom/scenarios/).

`reward`: game (the scenario's own), battle (shaped, BATTLE_SHAPING), gathering (the
game's plus a medikit bonus) or frags (+1 a frag, -1 a suicide). `objective`, reported
as info["true_objective"]: game_reward (the classic score), kills or frags.
"""
from __future__ import annotations

import os
from dataclasses import dataclass

FASTRL_SCENARIO_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "scenarios")


# Episodes an engine plays before DoomEnv replaces it, bounding its slow memory growth
# at about 1% of stepping time (doom_engine_memory in benchmarks/experiments/README.md).
ENGINE_RECYCLE_EPISODES = 1000


@dataclass(frozen=True)
class DoomScenario:
    name: str
    config: str  # "vizdoom:<file>" (ViZDoom's own) or "fastrl:<file>" (envs/doom/scenarios)
    wad: str | None  # ViZDoom-shipped map to use with a fastrl config, else the config's own
    reward: str  # "game" | "battle" | "gathering" | "frags"
    objective: str  # "game_reward" | "kills" | "frags"
    description: str
    bots: int = 0  # ViZDoom bots the game's host adds after each new episode
    # A network deathmatch fastrl hosts on 127.0.0.1: players respawn, episodes end only
    # at the timeout, and several learning agents may share a game (match.py).
    deathmatch: bool = False
    agents: int = 1  # learning agents in each game (DoomMatch seats); the default of --doom_agents

    def config_path(self) -> str:
        where, _, filename = self.config.partition(":")
        if where == "fastrl":
            return os.path.join(FASTRL_SCENARIO_DIR, filename)
        import vizdoom

        return os.path.join(vizdoom.scenarios_path, filename)

    def wad_path(self) -> str | None:
        if self.wad is None:
            return None
        import vizdoom

        return os.path.join(vizdoom.scenarios_path, self.wad)


# health_gathering's own reward credits a medikit only through the tics it buys much
# later, too late for the discount to carry back; a bonus on the pickup step makes the
# cause visible. Its weight against the living reward matches Sample Factory's, so the
# two are compared on the same incentive.
GATHERING_PICKUP_REWARD = 100.0


# Weights of the doom_battle reward: each term multiplies the step's change of a
# game variable ("+" keeps only increases). Kills dominate; the rest lead a
# beginner there: hurt monsters, pick up what keeps you fighting, do not die.
BATTLE_SHAPING = (
    ("KILLCOUNT", "+", 1.0),      # a kill
    ("DAMAGECOUNT", "+", 0.01),   # damage dealt: an imp (60 hp) is worth 0.6 before the kill
    ("HEALTH", "+", 0.01),        # health picked up: a medikit (25) is 0.25
    ("ARMOR", "+", 0.005),        # armor picked up
    ("AMMO2", "+", 0.01),         # bullets: a clip (10) is 0.1
    ("AMMO3", "+", 0.03),         # shells: 4 shells are 0.12
    ("AMMO4", "+", 0.1),          # rockets
    ("AMMO5", "+", 0.004),        # cells: 20 cells are 0.08
    ("WEAPON2", "+", 0.25),       # a new weapon
    ("WEAPON3", "+", 0.25),
    ("WEAPON4", "+", 0.25),
    ("WEAPON5", "+", 0.25),
    ("WEAPON6", "+", 0.25),
    ("WEAPON7", "+", 0.25),
    ("DEAD", "+", -1.0),          # death penalty
)

SCENARIOS = {s.name: s for s in (
    DoomScenario(
        "doom_battle", "fastrl:battle.cfg", "deathmatch.wad", "battle", "kills",
        "Fight monsters that keep coming in an arena with weapons, health and ammo to pick up "
        "(ViZDoom's deathmatch.wad); shaped reward, true objective kills per episode."),
    DoomScenario(
        "doom_deathmatch", "fastrl:deathmatch.cfg", "cig.wad", "frags", "frags",
        "Deathmatch against ViZDoom bots on ViZDoom's cig.wad map01, respawning on death; "
        "reward and true objective are frags.", bots=6, deathmatch=True),
    DoomScenario(
        "doom_duel", "fastrl:duel.cfg", "multi_duel.wad", "frags", "frags",
        "Two learning agents against each other in one game on ViZDoom's multi_duel.wad, a small arena "
        "(agents of different policies when --num_policies is 2 or more); reward and true objective are frags.",
        deathmatch=True, agents=2),
    DoomScenario(
        "doom_basic", "vizdoom:basic.cfg", None, "game", "game_reward",
        "ViZDoom basic: shoot the monster in front of you as fast as possible."),
    DoomScenario(
        "doom_defend_the_center", "vizdoom:defend_the_center.cfg", None, "game", "game_reward",
        "ViZDoom defend_the_center: turn and shoot monsters closing in from all sides."),
    DoomScenario(
        "doom_defend_the_line", "vizdoom:defend_the_line.cfg", None, "game", "game_reward",
        "ViZDoom defend_the_line: turn and shoot monsters that come from across a room, some firing back."),
    DoomScenario(
        "doom_health_gathering_supreme", "vizdoom:health_gathering_supreme.cfg", None, "gathering", "game_reward",
        "ViZDoom health_gathering_supreme: survive on an acid floor by collecting medikits in a maze; "
        "trained on the game's reward plus a bonus per medikit, true objective the game's score."),
    DoomScenario(
        "doom_deadly_corridor", "vizdoom:deadly_corridor.cfg", None, "game", "game_reward",
        "ViZDoom deadly_corridor: reach the vest at the end of a corridor lined with shooters."),
    DoomScenario(
        "doom_my_way_home", "vizdoom:my_way_home.cfg", None, "game", "game_reward",
        "ViZDoom my_way_home: find the vest in a maze of rooms, sparse reward."),
    DoomScenario(
        "doom_custom", "", None, "game", "game_reward",
        "Your own ViZDoom scenario: doom_scenario=PATH.cfg, with fastrl's screen, frameskip "
        "and action wrappers and the scenario's own reward."),
)}


def get_scenario(name: str) -> DoomScenario:
    try:
        return SCENARIOS[name]
    except KeyError:
        raise ValueError(f"unknown Doom scenario {name!r}; known: {', '.join(SCENARIOS)}") from None
