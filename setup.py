"""hf_hsap: sequence-aware parallel attention for packed training data (HSAP)."""
from setuptools import find_packages, setup

setup(
    name="hf_hsap",
    version="0.1.0",
    description=(
        "Hierarchical Sequence-Aware Parallelism (HSAP): exact document-masked attention for packed "
        "rows under sequence parallelism, for Transformers, Accelerate and TRL."
    ),
    long_description=open("README.md", encoding="utf-8").read(),
    long_description_content_type="text/markdown",
    packages=find_packages(include=["hf_hsap", "hf_hsap.*"]),
    python_requires=">=3.10",
    install_requires=[
        # torch is pinned by the install script (a CPU wheel on CPU machines); any 2.6+ works.
        "torch>=2.6",
        "transformers>=4.56",
        "accelerate>=1.10",
        "datasets>=3.0",
        "trl>=1.16",  # trl.kernels.ChunkedLogProbFunction (the chunked loss) and its activation offloading
        "kernels>=0.19",  # the per-layer kernel hooks hf_hsap replaces to make hybrid models' recurrent layers exact
        "numpy>=1.24",
        "psutil>=5.9",  # the host's memory and a process's resident set (the fit check); Accelerate needs it too
    ],
    extras_require={
        "test": ["pytest>=8", "hypothesis>=6.100", "pytest-timeout>=2.3", "matplotlib>=3.7", "tensorboard",
                 "import-linter>=2.1", "scipy>=1.10",
                 "num2words",  # SmolVLM's processor (the tiny TRL VLMs of hf_hsap.examples.trl_vlms)
                 "mkdocs>=1.6", "mkdocs-material>=9.5", "mkdocstrings[python]>=0.26"],  # the docs site (tests/docs)
        "bench": ["matplotlib>=3.7", "scipy>=1.10"],
        "gpu": ["flash-attn>=2.6"],
    },
    entry_points={"console_scripts": ["hsap-plan=hf_hsap.inspect:main", "hsap-sft=hf_hsap.cli.sft:main"]},
)
