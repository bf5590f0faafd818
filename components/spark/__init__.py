"""KFP components of `vaecf launch-sparkapp`: preprocess and split on Spark."""

from components.spark.component import spark_preprocess, spark_split

__all__ = ["spark_preprocess", "spark_split"]
