"""gym-sokoban as the reference: its generator at a chosen search depth, and its step.

gym-sokoban 0.0.6 hard-codes the reverse-play depth (ttl=300); RAGEN exposes it as
`search_depth`. To compare generators at the same settings we call gym-sokoban's own
topology, placement and depth-first search functions, passing the depth as the search's ttl.
"""

from __future__ import annotations

import random
import warnings

import numpy as np

warnings.filterwarnings("ignore")
from gym_sokoban.envs import room_utils  # noqa: E402
from gym_sokoban.envs.sokoban_env import SokobanEnv  # noqa: E402


def gym_generate_room(dim, num_boxes, search_depth, seed, tries=4):
    """gym-sokoban's generate_room with the DFS depth exposed; retries like SokobanEnv.reset."""
    random.seed(seed)
    np.random.seed(seed)
    num_steps = int(1.7 * (dim[0] + dim[1]))
    while True:
        for _ in range(tries):
            room = room_utils.room_topology_generation(dim, 0.35, num_steps)
            try:
                room = room_utils.place_boxes_and_player(room, num_boxes=num_boxes, second_player=False)
            except RuntimeError:
                continue
            room_structure = np.copy(room)
            room_structure[room_structure == 5] = 1
            room_state = room.copy()
            room_state[room_state == 2] = 4
            box_mapping = {}
            for r, c in zip(*np.where(room_structure == 2)):
                box_mapping[(r, c)] = (r, c)
            room_utils.explored_states = set()
            room_utils.num_boxes = num_boxes
            room_utils.best_room_score = -1
            room_utils.best_room = None
            room_utils.best_box_mapping = box_mapping
            room_utils.depth_first_search(room_state, room_structure, box_mapping, box_swaps=0,
                                          last_pull=(-1, -1), ttl=search_depth)
            best, score = room_utils.best_room, room_utils.best_room_score
            if score > 0:
                best = best.copy()
                best[best == 3] = 4
                return room_structure, best


def make_gym_env(room_fixed, room_state, max_steps, num_boxes):
    """A gym-sokoban env holding exactly the given level (no generation)."""
    env = SokobanEnv(dim_room=room_fixed.shape, max_steps=max_steps, num_boxes=num_boxes, reset=False)
    env.room_fixed = np.array(room_fixed, dtype=np.int64)
    env.room_state = np.array(room_state, dtype=np.int64)
    env.player_position = np.argwhere(env.room_state == 5)[0]
    env.num_env_steps = 0
    env.reward_last = 0
    empty = (env.room_state == 2) | ((env.room_fixed == 2) & (env.room_state == 5))
    env.boxes_on_target = num_boxes - int(empty.sum())
    return env
