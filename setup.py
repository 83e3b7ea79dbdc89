from setuptools import setup

# The core trainer needs only torch, numpy, faster-fifo and gymnasium; the
# rest are extras so that a CartPole user does not pull in a Doom engine.
# gymnasium's v5 locomotion tasks (Hopper-v5, Walker2d-v5, ...).
MUJOCO = ["gymnasium[mujoco]>=1.0"]
# opencv-python-headless instead of opencv-python: same cv2 API, but no GUI
# libraries (libGL) that headless servers and CI machines lack.
EXTRAS = {
    "doom": ["vizdoom>=1.2", "opencv-python-headless>=4.8"],
    "atari": ["ale-py>=0.9", "opencv-python-headless>=4.8"],
    "wandb": ["wandb>=0.16"],
    "plot": ["matplotlib>=3.5"],
    "mujoco": MUJOCO,
    # mkdocs builds the docs site (.ci/run, tests/test_docs_site.py); 1.6 for mkdocs.yml's anchor checks;
    # MuJoCo for the end-to-end run of a locomotion task (tests/test_train_e2e.py).
    "dev": ["pytest>=7", "mkdocs>=1.6", *MUJOCO],
}
EXTRAS["all"] = sorted({dep for deps in EXTRAS.values() for dep in deps})

setup(
    name="fastrl",
    version="0.1.0",
    description="Asynchronous APPO reinforcement learning, as fast as one machine allows.",
    long_description=open("README.md").read() if __import__("os").path.exists("README.md") else "",
    long_description_content_type="text/markdown",
    license="MIT",
    # Linux only: faster-fifo's queues, prctl's parent-death signal and /dev/shm.
    classifiers=[
        "License :: OSI Approved :: MIT License",
        "Operating System :: POSIX :: Linux",
        "Programming Language :: Python :: 3",
        "Topic :: Scientific/Engineering :: Artificial Intelligence",
    ],
    packages=["fastrl", "fastrl.algo", "fastrl.plumbing", "fastrl.sampling", "fastrl.learning", "fastrl.tuning",
              "fastrl.runtime", "fastrl.cuda", "fastrl.envs", "fastrl.envs.doom"],
    # envs/ stays a top-level folder of the repository (envs know nothing of the
    # trainer) but installs inside fastrl's namespace: a top-level "envs" package
    # would clash with any other project's of that name.
    package_dir={"fastrl.envs": "envs"},
    # caching_allocator.cpp is built on the user's machine, at first use (fastrl/plumbing/caching_allocator.py).
    package_data={"fastrl.envs.doom": ["scenarios/*", "net_yield.c"], "fastrl.plumbing": ["caching_allocator.cpp"]},
    python_requires=">=3.9",
    install_requires=[
        # 2.6: torch.load(weights_only=True) runs no code from a checkpoint someone hands you
        # (earlier releases could be made to); 2.4 brought the fused Adam kernel on CPUs.
        "torch>=2.6",
        "numpy>=1.24",
        "faster-fifo>=1.5",
        "gymnasium>=0.29",
        "setproctitle>=1.3",
        "psutil>=5.9",
        "tensorboard>=2.12",
        "tqdm>=4.60",
        "pyyaml>=5.1",  # --config files: a well-kept parser beats a hand-written one
        "safetensors>=0.4",  # exported weights (fastrl.export): tensors only, so loading one runs no code
    ],
    extras_require=EXTRAS,
)
