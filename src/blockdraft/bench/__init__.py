"""The benchmark: Spec-Bench questions, every method side by side in one process, reports and plots."""

from .questions import Question, default_question_file, load_questions
from .run import BenchConfig, run_bench

__all__ = ["BenchConfig", "Question", "default_question_file", "load_questions", "run_bench"]
