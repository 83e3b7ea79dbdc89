"""The Doom scenarios fastrl knows, in one table. No vizdoom import here, so the
registry can list and validate names on machines without the Doom extra.

Maps: ViZDoom's own shipped scenarios, found at run time in vizdoom.scenarios_path.
Configs: ViZDoom's own .cfg for its classic scenarios; fastrl's own .cfg files in
envs/doom/scenarios/ for doom_battle and doom_deathmatch (they name no map file,
since the install path of ViZDoom's .wad is only known at run time).

Rewards (`reward`):
    game    the scenario's own reward (its .cfg living reward, death penalty and
            the map's scripted rewards), unchanged.
    battle  shaped, from game-variable changes each step (see BATTLE_SHAPING).
    gathering  the scenario's own reward plus GATHERING_PICKUP_REWARD on each step
            whose health rose (a medikit picked up).
    frags   change in FRAGCOUNT: +1 per frag, -1 per suicide. Nothing else.
True objective (`objective`, reported in info["true_objective"] when an episode ends):
    game_reward  the episode's total scenario reward (the standard score of
                 ViZDoom's classic scenarios).
    kills        KILLCOUNT at the end of the episode.
    frags        FRAGCOUNT at the end of the episode.
"""
from __future__ import annotations

import os
from dataclasses import dataclass

FASTRL_SCENARIO_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "scenarios")


# Episodes a ViZDoom engine plays before DoomEnv replaces it with a fresh one (the
# trainer's --doom_engine_recycle_episodes defaults to it too).
# Measured with benchmarks/experiments/doom_engine_memory.py (AMD EPYC, 2 cores): an engine grows
# 1.6-1.9 MB per million frames it renders, and a replacement costs 0.12-0.13 s. On the
# shortest episodes seen (doom_basic under random actions, 13 ms of bare stepping each)
# 1000 episodes keep that cost at 1% of the engine's own stepping time, far less of a
# trainer's, where each frame also waits for the model; and an engine then never grows
# by more than ~8 MB (1000 of doom_battle's longest episodes, 4,200 frames each).
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
    # A network deathmatch that fastrl hosts on 127.0.0.1 (-host N): players respawn
    # where they die, episodes end only at the timeout, and several learning agents
    # may play in one game (envs/doom/match.py).
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


# health_gathering's own reward (+1 a tic alive, -100 at death) credits a medikit
# only through the tics it buys later, hundreds of tics after the pickup: too late
# for a discount of 0.99 a step to carry back. A bonus on the step of the pickup
# makes the cause visible. 100 is 25 agent steps of living reward, the weight
# Sample Factory gives its own gathering bonus against its living reward (+1 a
# pickup, 0.01 a tic), so the two systems are compared on the same incentive.
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
