"""Deterministic global batches by step, and slicing them among workers."""

from hetjax.data._data_file import DataFile as DataFile
from hetjax.data._data_file import is_data_path as is_data_path
from hetjax.data._data_file import read_data_file as read_data_file
from hetjax.data._design_file import read_design as read_design
from hetjax.data._digits import digits as digits
from hetjax.data._docstrings import Documents as Documents
from hetjax.data._docstrings import stdlib_docstrings as stdlib_docstrings
from hetjax.data._documents_file import read_documents as read_documents
from hetjax.data._prepare_text import prepare_text as prepare_text
from hetjax.data._ratings import Ratings as Ratings
from hetjax.data._ratings import zipf_ratings as zipf_ratings
from hetjax.data._ratings_file import read_ratings as read_ratings
from hetjax.data._slicing import batch_size as batch_size
from hetjax.data._slicing import share_offsets as share_offsets
from hetjax.data._slicing import slice_batch as slice_batch
from hetjax.data._slicing import split_batch as split_batch
from hetjax.data._source import ArraySource as ArraySource
from hetjax.data._source import Batch as Batch
from hetjax.data._source import DataSource as DataSource
from hetjax.data._source import RowSource as RowSource
from hetjax.data._source import StepBatch as StepBatch
from hetjax.data._source import step_rng as step_rng
from hetjax.data._source import take_rows as take_rows
from hetjax.data._sparse_design import Response as Response
from hetjax.data._sparse_design import SparseDesign as SparseDesign
from hetjax.data._sparse_design import bundled_design as bundled_design
from hetjax.data._sparse_design import correlated_design as correlated_design
from hetjax.data._stdlib_text import StdlibText as StdlibText
from hetjax.data._stdlib_text import stdlib_text as stdlib_text
from hetjax.data._text_codec import text_codec as text_codec
from hetjax.data._token_file import TokenDataset as TokenDataset
from hetjax.data._token_file import Tokenizer as Tokenizer
from hetjax.data._token_file import check_vocab as check_vocab
from hetjax.data._token_file import read_token_dataset as read_token_dataset
from hetjax.data._token_file import write_token_split as write_token_split
from hetjax.data._zipf_clicks import ZipfClicks as ZipfClicks
from hetjax.data._zipf_clicks import zipf_clicks as zipf_clicks

__all__ = [
    'ArraySource',
    'Batch',
    'DataFile',
    'DataSource',
    'Documents',
    'Ratings',
    'Response',
    'RowSource',
    'SparseDesign',
    'StdlibText',
    'StepBatch',
    'TokenDataset',
    'Tokenizer',
    'ZipfClicks',
    'batch_size',
    'bundled_design',
    'check_vocab',
    'correlated_design',
    'digits',
    'is_data_path',
    'prepare_text',
    'read_data_file',
    'read_design',
    'read_documents',
    'read_ratings',
    'read_token_dataset',
    'share_offsets',
    'slice_batch',
    'split_batch',
    'stdlib_docstrings',
    'stdlib_text',
    'step_rng',
    'take_rows',
    'text_codec',
    'write_token_split',
    'zipf_clicks',
    'zipf_ratings',
]
