"""What code outside the package may use to read and write topics without a broker's internals: the Spark
source (spark/pyspark_danube) and any other reader. Four modules, by what they reach:

* `metadata`: the metadata store read-only (`open_reader`), its keys and the records read there, names.
* `objects`: the object tier (stores, descriptors, the `.dnb1` format) and the record-batch codec.
* `brokers`: a broker's client side (the offset reader, the fast producer, TLS and tokens).
* `tables`: topic tables (the catalog, their properties and columns) and schema-typed values.

The modules behind these names may move; the names stay, and tests/test_imports.py holds spark/ to them.
"""
